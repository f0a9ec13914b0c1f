"""A seeded procedural generator of simple stories: the built-in model's pretraining corpus.

Stories are assembled from characters, places, objects, feelings and events with varied
sentence templates. "happy" is one feeling among many with a small weight, so it occurs
naturally but rarely (about 0.1-0.2 times per story): the happy-stories reward starts low
and the policy has to *learn* to hack it.
"""

from __future__ import annotations

import random

NAMES = ["Mia", "Tom", "Lily", "Ben", "Sam", "Anna", "Max", "Zoe", "Leo", "Ella", "Jack",
         "Rosa", "Finn", "Nina", "Kai", "Ivy", "Omar", "Lucy", "Theo", "Maya", "Eli", "Ruby"]
KINDS = ["a little girl", "a little boy", "a small rabbit", "a brave dog", "an old cat",
         "a young bird", "a kind bear", "a tiny mouse", "a curious fox", "a shy turtle",
         "a clever girl", "a tall boy", "a small frog", "a gentle horse"]
PLACES = ["in a small village", "near a big forest", "by the sea", "in a quiet town",
          "on a green hill", "in a busy city", "next to a river", "in a cozy house",
          "on a little farm", "at the edge of a lake", "under a tall mountain", "in a sunny garden"]
OBJECTS = ["a red ball", "a shiny stone", "an old map", "a blue kite", "a lost key",
           "a little box", "a yellow flower", "a wooden boat", "a soft blanket", "a green hat",
           "a golden bell", "a tiny book", "a paper star", "a silver spoon"]
WHERE_FOUND = ["under a tree", "behind the door", "near the pond", "in the tall grass",
               "on the path", "inside a hollow log", "under the bed", "by the old fence"]
# Feelings with weights: "happy" is deliberately rare.
FEELINGS = [("sad", 6), ("scared", 6), ("curious", 8), ("tired", 5), ("excited", 6),
            ("calm", 5), ("proud", 5), ("brave", 5), ("surprised", 6), ("worried", 6),
            ("glad", 4), ("lonely", 4), ("angry", 3), ("shy", 4), ("happy", 5)]
WEATHER = ["The sun was warm.", "The wind was cold.", "It started to rain.",
           "The sky was full of clouds.", "Snow fell softly.", "The stars came out."]
ACTIONS = ["played a game", "built a tower of blocks", "drew a picture", "sang a song",
           "ran to the park", "read a book", "baked some bread", "planted a seed",
           "made a little boat", "looked at the stars", "climbed a small tree", "fed the ducks"]
LESSONS = ["sharing makes everything better", "it is good to ask for help",
           "being kind is important", "trying again is brave", "friends help each other",
           "small things can matter a lot", "it is fine to be scared sometimes",
           "listening is a gift"]


def _feeling(rng: random.Random) -> str:
    words, weights = zip(*FEELINGS)
    return rng.choices(words, weights=weights, k=1)[0]


def _opening(rng: random.Random, name: str, kind: str, place: str) -> list[str]:
    form = rng.randrange(4)
    if form == 0:
        return [f"Once upon a time, there was {kind} named {name}.", f"{name} lived {place}."]
    if form == 1:
        return [f"{name} was {kind} who lived {place}."]
    if form == 2:
        return [f"One {rng.choice(['sunny', 'rainy', 'quiet', 'cold', 'bright'])} morning, "
                f"{name} woke up early.", f"{name} was {kind} who lived {place}."]
    return [f"There once was {kind} called {name}.", f"Every day, {name} played {place}."]


def _middle(rng: random.Random, name: str, friend: str) -> list[str]:
    obj = rng.choice(OBJECTS)
    event = rng.randrange(5)
    out: list[str] = []
    if event == 0:
        out += [f"One day, {name} found {obj} {rng.choice(WHERE_FOUND)}.",
                f"{name} felt {_feeling(rng)}.",
                f"{name} showed it to {friend}.",
                f"\"Where did it come from?\" asked {friend}."]
    elif event == 1:
        out += [f"One day, {name} lost {obj}.", f"{name} felt {_feeling(rng)}.",
                f"{name} looked {rng.choice(WHERE_FOUND)}, but it was not there.",
                f"Then {friend} came to help."]
    elif event == 2:
        out += [f"{name} met {friend} on the way home.", rng.choice(WEATHER),
                f"They {rng.choice(ACTIONS)} together.", f"{friend} felt {_feeling(rng)}."]
    elif event == 3:
        out += [f"{name} wanted to {rng.choice(['fly', 'find', 'fix'])} {obj}.",
                "But it was hard.", f"{name} felt {_feeling(rng)} and sat down.",
                f"{friend} said, \"Let us try again.\""]
    else:
        out += [rng.choice(WEATHER), f"{name} and {friend} {rng.choice(ACTIONS)}.",
                f"Then they {rng.choice(ACTIONS)}.", f"{name} felt {_feeling(rng)}."]
    if rng.random() < 0.5:
        out.append(f"After a while, {name} {rng.choice(ACTIONS)}.")
    return out


def _ending(rng: random.Random, name: str, friend: str) -> list[str]:
    form = rng.randrange(4)
    if form == 0:
        return [f"From that day on, {name} and {friend} were best friends."]
    if form == 1:
        return [f"{name} learned that {rng.choice(LESSONS)}."]
    if form == 2:
        return [f"At the end of the day, {name} felt {_feeling(rng)}.", "They went home to sleep."]
    return ["They smiled and walked home together.", f"{name} felt {_feeling(rng)}."]


def make_story(rng: random.Random) -> str:
    name, friend = rng.sample(NAMES, 2)
    sents = _opening(rng, name, rng.choice(KINDS), rng.choice(PLACES))
    sents += _middle(rng, name, friend)
    sents += _ending(rng, name, friend)
    return " ".join(sents)


def make_corpus(n: int, seed: int) -> list[str]:
    """n stories, fully determined by seed."""
    rng = random.Random(seed)
    return [make_story(rng) for _ in range(n)]


def story_opening(story: str, n_sentences: int = 1) -> str:
    """The first sentence(s) of a story, used as an RL prompt."""
    parts = story.split(". ")
    head = ". ".join(parts[:n_sentences])
    return head if head.endswith(".") else head + "."


# Seeds for the three disjoint story streams: pretraining, RL prompts, evaluation prompts.
PRETRAIN_SEED = 0
PROMPT_SEED = 10_001
EVAL_SEED = 20_002
