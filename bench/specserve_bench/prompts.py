"""Prompts beyond code, written for `specserve bench spec` (and never used to train or tune a draft):
chat (some multi-turn), summarisation, translation, math and question answering, each a conversation
sent through the model's chat template."""
from __future__ import annotations

_PASSAGE_1 = ("The city council met on Tuesday to discuss the new bicycle lanes planned for the old market "
              "district. Shop owners worried that removing parking spaces would drive customers away, while "
              "cyclists argued that safer streets would bring more people on foot and by bike. After three "
              "hours of debate, the council agreed to a six-month trial on two streets, with a survey of "
              "businesses before and after.")
_PASSAGE_2 = ("Honeybees communicate the location of food through a movement called the waggle dance. A "
              "forager returning to the hive walks in a figure-eight pattern; the angle of the straight run "
              "relative to vertical tells the other bees the direction of the food relative to the sun, and "
              "the length of the run tells them the distance. Researchers decoded the dance in the 1940s, "
              "and it remains one of the few known examples of symbolic communication in insects.")
_PASSAGE_3 = ("A small bakery started selling day-old bread at half price in the last hour before closing. "
              "Within a month, food waste fell by a third, and the late-afternoon customers who came for the "
              "discount often bought full-price pastries as well. The owner now plans to donate whatever is "
              "left at closing time to a shelter two streets away.")
_PASSAGE_4 = ("Lighthouses once needed keepers who lived on site, trimmed the lamp wicks and wound the "
              "clockwork that turned the lens. Electrification and automation in the twentieth century made "
              "the keepers unnecessary, and today most lighthouses run unattended, monitored remotely, with "
              "some converted into museums or guest houses.")


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


CATEGORIES: dict[str, list[list[dict]]] = {
    "chat": [
        _user("Hi! Can you suggest a few fun things to do on a rainy weekend at home?"),
        _user("I have an interview for a library assistant job tomorrow. Any tips?"),
        _user("What is a good way to start learning to play the guitar as an adult?"),
        _user("Can you recommend a simple dinner I can cook in twenty minutes?"),
        [{"role": "user", "content": "I want to get better at running. I can run about 2 km now."},
         {"role": "assistant", "content": "That is a great start! A gradual plan works best: add a little "
                                          "distance each week and keep most runs at an easy pace."},
         {"role": "user", "content": "How many days a week should I run, and what should I do on the other days?"}],
        [{"role": "user", "content": "My tomato plants have yellow leaves at the bottom."},
         {"role": "assistant", "content": "Yellow lower leaves are common. They can come from overwatering, "
                                          "a lack of nitrogen, or simply old leaves dying back."},
         {"role": "user", "content": "I water them every day. Could that be the problem? What should I change?"}],
        [{"role": "user", "content": "Help me plan a birthday party for my eight-year-old."},
         {"role": "assistant", "content": "Happy to help! How many children are coming, and is it indoors or outdoors?"},
         {"role": "user", "content": "About twelve kids, in our back garden. What games could we play?"}],
        _user("Write a short, friendly message to thank a neighbour who watered my plants while I was away."),
    ],
    "summarisation": [
        _user(f"Summarise this in two sentences:\n\n{_PASSAGE_1}"),
        _user(f"Summarise the following paragraph in one sentence:\n\n{_PASSAGE_2}"),
        _user(f"Give a short summary of this text:\n\n{_PASSAGE_3}"),
        _user(f"Summarise this passage for a ten-year-old:\n\n{_PASSAGE_4}"),
        _user(f"List the three main points of this text as bullet points:\n\n{_PASSAGE_1}"),
        _user(f"What is the main idea of this paragraph?\n\n{_PASSAGE_2}"),
        _user(f"Write a headline and a one-sentence summary for this story:\n\n{_PASSAGE_3}"),
        _user(f"Summarise the history described here in a few sentences:\n\n{_PASSAGE_4}"),
    ],
    "translation": [
        _user("Translate into French: The train to the airport leaves every fifteen minutes from platform two."),
        _user("Translate into Spanish: Could you tell me where the nearest pharmacy is, please?"),
        _user("Translate into German: We are looking forward to seeing you at the meeting next week."),
        _user("Translate into English: Je voudrais réserver une table pour deux personnes ce soir."),
        _user("Translate into English: El museo está cerrado los lunes, pero abre temprano los martes."),
        _user("Translate into French: My sister works as a nurse in a small hospital near the coast."),
        _user("Translate into Spanish: The weather will be sunny in the morning and rainy in the afternoon."),
        _user("Translate into Italian: Thank you very much for your help with the move."),
    ],
    "math": [
        _user("A shop sells pencils at 3 for 45 cents. How much do 12 pencils cost? Explain step by step."),
        _user("If a train travels 180 km in 2 hours, what is its average speed? Show your reasoning."),
        _user("What is 15% of 240? Explain how you calculate it."),
        _user("Solve for x: 3x + 7 = 25. Show each step."),
        _user("A rectangle is 8 cm long and 5 cm wide. What are its area and its perimeter?"),
        _user("Tom has 24 apples. He gives a third to his sister and half of the rest to a friend. How many are left?"),
        _user("What is the sum of the angles in a triangle, and why?"),
        _user("Convert 3.5 hours into minutes and then into seconds, step by step."),
    ],
    "qa": [
        _user("Why is the sky blue?"),
        _user("What is the difference between weather and climate?"),
        _user("How do vaccines help the body fight disease?"),
        _user("What causes the seasons on Earth?"),
        _user("What is photosynthesis, and why is it important?"),
        _user("Why do we have leap years?"),
        _user("How does a refrigerator keep food cold?"),
        _user("What is the water cycle?"),
    ],
}


def conversations(per_category: int = 8) -> list[tuple[str, list[dict]]]:
    """(category, conversation) pairs, per_category of each, categories interleaved (so that a batch of
    consecutive prompts mixes them)."""
    n = min(per_category, min(len(v) for v in CATEGORIES.values()))
    return [(cat, CATEGORIES[cat][i]) for i in range(n) for cat in CATEGORIES]
