"""The server's routes, one module per concern: admin.py (the playground page, /health, /metrics,
/v1/models), completions.py (/v1/completions), chat.py (/v1/chat/completions). Each module's router()
builds an APIRouter over what it needs; app.py includes them."""
