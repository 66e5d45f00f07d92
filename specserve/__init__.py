"""specserve: a fast, lossless LLM inference engine."""
import os as _os
import signal as _signal
import sys as _sys

if _os.path.basename(_sys.argv[0]) == "specserve" and _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    # The `specserve` command: Ctrl-C while it is still importing exits quietly (130) instead of a
    # traceback from the middle of an import (cli.main() keeps it so, except with --debug).
    _signal.signal(_signal.SIGINT, lambda *_: _os._exit(130))

from .types import CompletionOutput, RequestOutput, SamplingParams, StreamDelta

__version__ = "0.1.0"


def __getattr__(name):
    # LLM pulls in torch; keep `import specserve` light for the plain-Python parts.
    if name == "LLM":
        from .engine.llm import LLM
        return LLM
    if name == "AsyncLLM":
        from .engine.async_llm import AsyncLLM
        return AsyncLLM
    if name in ("system_info", "format_system_info", "summary_line", "speed_hint"):
        from . import sysinfo
        return getattr(sysinfo, name)
    raise AttributeError(name)


__all__ = ["LLM", "AsyncLLM", "SamplingParams", "RequestOutput", "CompletionOutput", "StreamDelta", "system_info",
           "format_system_info", "summary_line", "speed_hint"]
