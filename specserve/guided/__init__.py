"""Guided generation: grammars (JSON Schema, regex, choice, Lark/GBNF) compiled with llguidance, one
Guide per sequence. Torch-free; sampling/guided.py applies the masks."""
from .grammar import GrammarCompiler, Guide, grammar_text

__all__ = ["GrammarCompiler", "Guide", "grammar_text"]
