"""Instructions written for training a draft beyond code: chat requests, summaries, translations, math
word problems, questions and code explanations, each a one-turn conversation (a few two-turn ones),
which the target answers through its chat template (self-distillation data, `train-draft
--instructions N`).

Made offline and reproducibly from templates, word lists and the standard library's own docstrings
(the passages to summarise, the sentences to translate, the functions to explain), so nothing is
downloaded and the set is as large as asked. None of it is the bench's prompts (bench/prompts.py,
checked by a test): the bench measures the draft on text it was never trained on.
"""
from __future__ import annotations

import ast
import functools
import random
import re
import textwrap

from .corpus import stdlib_modules

TOPICS = [
    "gravity", "electricity", "magnetism", "volcanoes", "earthquakes", "tides", "rainbows", "clouds", "lightning",
    "the moon's phases", "black holes", "the solar system", "DNA", "cells", "the immune system", "digestion",
    "the heart", "sleep", "memory", "bacteria", "viruses", "plate tectonics", "erosion", "fossils", "dinosaurs",
    "the Roman Empire", "the printing press", "the industrial revolution", "ancient Egypt", "the Silk Road",
    "democracy", "inflation", "interest rates", "supply and demand", "taxes", "banks", "the stock market",
    "recycling", "composting", "solar panels", "wind turbines", "batteries", "electric cars", "the internet",
    "email", "passwords", "encryption", "search engines", "GPS", "radio", "television", "microwaves",
    "photography", "music scales", "rhythm", "painting with watercolours", "origami", "chess", "football",
    "marathons", "yoga", "nutrition", "vitamins", "coffee", "bread baking", "fermentation", "cheese making",
    "bees", "ants", "migration of birds", "whales", "coral reefs", "rainforests", "deserts", "glaciers",
    "rivers", "maps", "time zones", "calendars", "languages", "dialects", "libraries", "museums", "theatre",
]
ACTIVITIES = [
    "learning a new language", "keeping a tidy desk", "saving money each month", "cooking for a large family",
    "starting a vegetable garden", "training a puppy", "studying for exams", "running a first 5 km race",
    "making friends in a new city", "planning a road trip", "reading more books", "learning to swim",
    "drawing portraits", "writing a diary", "waking up earlier", "moving house", "hosting a dinner party",
    "choosing a laptop", "taking better photos", "staying focused while working from home",
]
EVENTS = ["a picnic", "a family reunion", "a surprise party", "a book club evening", "a charity bake sale",
          "a camping weekend", "a school fair", "a neighbourhood clean-up", "a board game night", "a small wedding"]
PEOPLE = ["my manager", "a teacher", "my landlord", "an old friend", "my grandmother", "a colleague", "my coach"]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jules", "Kofi", "Lena"]
ITEMS = [("apples", "bag"), ("pencils", "box"), ("stickers", "sheet"), ("eggs", "carton"), ("cards", "pack")]


@functools.lru_cache(maxsize=1)
def _stdlib_texts() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(docstring paragraphs of 150-700 characters, single sentences of 40-160 characters, short
    functions with their docstrings removed) from the standard library (parsed once: ~3 s)."""
    paras, sents, funcs = [], [], []
    for tree, lines in stdlib_modules():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Module)):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            for p in doc.split("\n\n"):
                p = " ".join(p.split())
                if 150 <= len(p) <= 700 and not re.search(r">>>|::|\|", p):
                    paras.append(p)
                for s in re.split(r"(?<=[.!?])\s+", p):
                    if 40 <= len(s) <= 160 and s[0].isupper() and s.endswith(".") and "`" not in s:
                        sents.append(s)
            if isinstance(node, ast.FunctionDef) and len(node.body) >= 3 and node.end_lineno - node.lineno <= 25:
                body = node.body[1:]  # without the docstring
                head = lines[node.lineno - 1]
                text = textwrap.dedent(head + "".join(lines[body[0].lineno - 1:node.end_lineno]))
                if len(text) <= 900:
                    funcs.append(text)
    return tuple(paras), tuple(sents), tuple(funcs)


def _doc_passages(limit: int, seed: int) -> tuple[list[str], list[str], list[str]]:
    rng = random.Random(seed)
    out = []
    for xs in _stdlib_texts():
        xs = list(xs)
        rng.shuffle(xs)
        out.append(xs[:limit])
    return out[0], out[1], out[2]


def _math(rng: random.Random) -> str:
    kind = rng.randrange(5)
    a, b, c = rng.randint(2, 40), rng.randint(2, 12), rng.randint(1, 9)
    name, other = rng.sample(NAMES, 2)
    item, unit = rng.choice(ITEMS)
    if kind == 0:
        return (f"{name} buys {b} {unit}s of {item}. Each {unit} holds {a} {item}. {name} gives {rng.randint(1, a * b - 1)} {item} to "
                f"{other}. How many are left? Work it out step by step.")
    if kind == 1:
        return f"A cyclist rides {a * b} km in {b} hours. At the same speed, how far does she ride in {b + c} hours? Explain your answer."
    if kind == 2:
        return f"What is {rng.choice([5, 10, 20, 25, 40])}% of {a * 10}? Show how to calculate it."
    if kind == 3:
        return f"Solve the equation {b}x - {c} = {b * a - c} and check the answer."
    return (f"A garden is {a} m long and {b} m wide. {name} wants a fence around it and grass on all of it. "
            "How much fence and how much grass are needed?")


def instructions(n: int, seed: int = 0) -> list[tuple[str, list[dict]]]:
    """n (category, conversation) pairs, categories in turn: chat, summarisation, translation, math,
    qa, code (explain a function), reproducible from the seed."""
    rng = random.Random(seed)
    paras, sents, funcs = _doc_passages(max(n, 64), seed)
    user = lambda text: [{"role": "user", "content": text}]
    makers = {
        "chat": lambda i: user(rng.choice([
            f"Do you have any advice on {rng.choice(ACTIVITIES)}?",
            f"I would like some tips for {rng.choice(ACTIVITIES)}. Where should I start?",
            f"Help me organise {rng.choice(EVENTS)} for about {rng.randint(5, 30)} people.",
            f"Write a short, polite note to {rng.choice(PEOPLE)} to say I will be late on {rng.choice(['Monday', 'Friday', 'Sunday'])}.",
            f"What could I do this evening if I feel bored and it is {rng.choice(['raining', 'snowing', 'very hot'])} outside?",
        ])) if i % 4 else [
            {"role": "user", "content": f"I am thinking about {rng.choice(ACTIVITIES)}."},
            {"role": "assistant", "content": "That sounds like a good plan. What would you like help with?"},
            {"role": "user", "content": rng.choice(["What mistakes do beginners make?", "How much time should I plan for it each week?",
                                                    "Can you give me a simple first step?"])}],
        "summarisation": lambda i: user(rng.choice(["Summarise this in one sentence:", "Give a brief summary of the following text:",
                                                    "Explain in simple words what this paragraph says:",
                                                    "Write two bullet points that sum up this text:"])
                                        + "\n\n" + paras[i % len(paras)]),
        "translation": lambda i: user(f"Translate into {rng.choice(LANGUAGES)}: {sents[i % len(sents)]}"),
        "math": lambda i: user(_math(rng)),
        "qa": lambda i: user(rng.choice(["What is {t}?", "Can you explain {t} to a twelve-year-old?", "Why does {t} matter?",
                                         "Tell me three interesting facts about {t}.", "How would you describe {t} in a few sentences?"])
                             .format(t=rng.choice(TOPICS))),
        "code": lambda i: user("Explain what this Python function does:\n\n```python\n" + funcs[i % len(funcs)] + "```"),
    }
    cats = list(makers)
    return [(cats[i % len(cats)], makers[cats[i % len(cats)]](i // len(cats))) for i in range(n)]
