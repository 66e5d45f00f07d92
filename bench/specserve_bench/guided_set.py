"""The guided bench's constraints, of growing difficulty, with chat prompts asking for them: JSON
Schemas (flat objects, enums, arrays, nested objects, string formats), a regex and a choice. Written
for the bench; the tests check validity on them too."""
from __future__ import annotations

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "maxLength": 40}}, "required": ["name", "age", "city"], "additionalProperties": False}

TICKET = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 60},
    "priority": {"type": "string", "enum": ["low", "medium", "high", "critical"]},
    "component": {"type": "string", "enum": ["frontend", "backend", "database", "infrastructure"]},
    "reproducible": {"type": "boolean"}},
    "required": ["title", "priority", "component", "reproducible"], "additionalProperties": False}

RECIPE = {"type": "object", "properties": {
    "dish": {"type": "string", "maxLength": 40},
    "servings": {"type": "integer", "minimum": 1, "maximum": 12},
    "ingredients": {"type": "array", "minItems": 2, "maxItems": 6, "items": {"type": "string", "maxLength": 30}},
    "vegetarian": {"type": "boolean"}},
    "required": ["dish", "servings", "ingredients", "vegetarian"], "additionalProperties": False}

ORDER = {"type": "object", "properties": {
    "order_id": {"type": "integer", "minimum": 1},
    "customer": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "email": {"type": "string", "format": "email", "maxLength": 40}},
        "required": ["name", "email"], "additionalProperties": False},
    "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}, "quantity": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["sku", "quantity"], "additionalProperties": False}},
    "status": {"type": "string", "enum": ["pending", "shipped", "delivered", "cancelled"]}},
    "required": ["order_id", "customer", "items", "status"], "additionalProperties": False}

EVENT = {"type": "object", "properties": {
    "event": {"type": "string", "maxLength": 50}, "date": {"type": "string", "format": "date"},
    "start_time": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"},
    "attendees": {"type": "array", "maxItems": 4, "items": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 30}, "role": {"type": "string", "enum": ["host", "speaker", "guest"]}},
        "required": ["name", "role"], "additionalProperties": False}},
    "location": {"type": "object", "properties": {
        "venue": {"type": "string", "maxLength": 40}, "capacity": {"type": "integer", "minimum": 1, "maximum": 100000}},
        "required": ["venue", "capacity"], "additionalProperties": False}},
    "required": ["event", "date", "start_time", "attendees", "location"], "additionalProperties": False}

# (name, schema, user message): flat -> enums -> arrays -> nested -> formats
SCHEMAS = [
    ("flat", PERSON, "Describe a fictional person as JSON with their name, age and city."),
    ("enums", TICKET, "File a bug report as JSON: the login page crashes when the password is empty."),
    ("array", RECIPE, "Give a simple pancake recipe as JSON: dish, servings, ingredients, vegetarian."),
    ("nested", ORDER, "Write an example online shop order as JSON with a customer and the items bought."),
    ("formats", EVENT, "Describe a small tech meetup as JSON: event name, date, start time, attendees, location."),
]
REGEX = (r"\(?[0-9]{3}\)? [0-9]{3}-[0-9]{4}", "Make up a US phone number for a pizza place.")
CHOICE = (["positive", "negative", "neutral"], "Classify the sentiment of this review: 'The food was cold and late.'")
