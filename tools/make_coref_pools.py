#!/usr/bin/env python3
"""Writes assets/benchmarks/coref/pools.json, the text pools of the co-reference benchmark.

Deterministic (fixed seed, stdlib only): running it twice gives the same file. Every math problem
carries its equation "a op b = c" and is re-checked before writing; the other pools are checked for
duplicates and for the shapes engine/eval/coref_pools.cpp validates.
Usage: python3 tools/make_coref_pools.py [--out PATH] [--check]
"""

import argparse
import json
import os
import random
import re
import sys

SEED = 20240607

# --- location names: invented words built from our own syllables, half with a landform noun ---
ONSETS = ["b", "br", "d", "dr", "f", "g", "gl", "h", "k", "kr", "l", "m", "n", "p", "qu", "r",
          "s", "sk", "t", "th", "v", "w", "z", "st", "tr"]
VOWELS = ["a", "e", "i", "o", "u", "ae", "ou", "y"]
CODAS = ["", "", "n", "r", "l", "th", "sk", "m", "nd", "rv", "lk", "st"]
LANDFORMS = ["Reach", "Hollow", "Quay", "Mere", "Crossing", "Fells", "Strand", "Heights",
             "Landing", "Marsh", "Gate", "Downs", "Bay", "Ford", "Vale", "Point"]



def with_articles(text):
    """'a island' -> 'an island': the templates write 'a {kind}' for every kind of place."""
    words = text.split(" ")
    for i in range(len(words) - 1):
        if words[i] in ("a", "A") and words[i + 1][:1].lower() in "aeiou":
            words[i] += "n"
    return " ".join(words)

def invented_word(rng):
    syllables = rng.choice([2, 2, 3])
    word = ""
    for i in range(syllables):
        word += rng.choice(ONSETS) + rng.choice(VOWELS)
        if i == syllables - 1 or rng.random() < 0.3:
            word += rng.choice(CODAS)
    return word.capitalize()


def make_location_names(rng, count):
    names, seen_words = [], set()
    while len(names) < count:
        word = invented_word(rng)
        if word in seen_words or not 5 <= len(word) <= 10:
            continue
        seen_words.add(word)
        if len(names) % 2 == 0:
            names.append(word + " " + rng.choice(LANDFORMS))
        else:
            names.append(word)
    return names


# --- contextual leads and their tie-back questions ---
# Each feature: (place kinds it suits, clause describing the place, tie-back naming that feature).
FEATURES = [
    (["harbour town", "island"], "whose lighthouse is painted a deep red", "with the red lighthouse"),
    (["mountain village", "valley"], "where goats wear copper bells", "where goats wear copper bells"),
    (["river town", "market town"], "whose bridge has seven stone arches", "with the seven-arched bridge"),
    (["village", "hamlet"], "where every door is painted yellow", "with the yellow doors"),
    (["city", "port"], "famous for its floating night market", "with the floating night market"),
    (["island", "coastal village"], "where the sand is almost black", "with the black sand"),
    (["town", "city"], "whose clock tower runs ten minutes slow", "whose clock tower runs slow"),
    (["valley", "village"], "covered in lavender fields every summer", "with the lavender fields"),
    (["desert town", "oasis"], "built around a spring that never dries", "with the spring that never dries"),
    (["fishing village", "harbour town"], "where the boats carry blue sails", "whose boats carry blue sails"),
    (["hill town", "village"], "where a windmill still grinds flour", "where the windmill grinds flour"),
    (["city", "town"], "whose library is carved into a cliff", "with the library carved into a cliff"),
    (["island", "village"], "home to a colony of white herons", "with the white herons"),
    (["forest village", "hamlet"], "where houses stand on wooden stilts", "with houses on stilts"),
    (["mining town", "mountain town"], "known for its silver mines", "with the silver mines"),
    (["town", "village"], "whose fountain spouts warm water", "with the warm fountain"),
    (["port", "city"], "where ferries leave every hour for the south", "with the hourly ferries"),
    (["village", "town"], "that holds a kite festival each spring", "with the kite festival"),
    (["valley", "hill town"], "where the vineyards climb up terraces", "with the terraced vineyards"),
    (["river town", "village"], "where a wooden waterwheel turns day and night", "with the waterwheel"),
    (["lake town", "village"], "that sits beside a lake shaped like a crescent", "by the crescent lake"),
    (["town", "city"], "whose streets are paved with green glass", "with the green glass streets"),
    (["island", "harbour town"], "where the seals sleep on the pier", "where seals sleep on the pier"),
    (["mountain village", "hamlet"], "reached only by a rope bridge", "reached by the rope bridge"),
    (["market town", "city"], "known for a cheese market held on Thursdays", "with the Thursday cheese market"),
    (["village", "coastal town"], "whose church bell was cast from a ship's anchor", "whose bell came from an anchor"),
    (["desert town", "city"], "where the walls are built from pink clay", "with the pink clay walls"),
    (["forest town", "village"], "surrounded by ancient cedar trees", "among the cedar trees"),
    (["town", "port"], "where the cranes at the docks are painted orange", "with the orange cranes"),
    (["island", "village"], "where no cars are allowed", "where cars are not allowed"),
    (["valley", "town"], "that floods every autumn when the snow melts early", "that floods every autumn"),
    (["village", "hamlet"], "whose only shop sells candles and maps", "whose shop sells candles and maps"),
    (["city", "town"], "where the theatre is older than the castle", "with the ancient theatre"),
    (["hill town", "village"], "crowned by a ruined observatory", "with the ruined observatory"),
    (["river port", "town"], "where barges carry salt downstream", "where barges carry salt"),
    (["mountain town", "village"], "where a glacier can be seen from every window", "with the glacier view"),
    (["harbour town", "fishing village"], "where the fish market opens before dawn", "with the dawn fish market"),
    (["village", "town"], "known for weaving carpets with star patterns", "known for star-patterned carpets"),
    (["island", "coastal village"], "whose cliffs are full of puffin nests", "with the puffin cliffs"),
    (["town", "city"], "where the tram runs in a perfect circle", "with the circular tram"),
    (["village", "valley"], "where honey is collected from wild bees", "with the wild honey"),
    (["city", "port"], "whose harbour wall is covered in murals", "with the painted harbour wall"),
    (["hamlet", "village"], "where a single oak shades the whole square", "with the great oak"),
    (["desert town", "oasis"], "where camels rest beside date palms", "with the date palms"),
    (["town", "village"], "whose bakery has baked bread since before anyone can remember",
     "with the famous old bakery"),
    (["lake town", "island"], "where the houses float on rafts", "with the floating houses"),
    (["mountain village", "hill town"], "where snow falls even in midsummer", "where snow falls in midsummer"),
    (["city", "town"], "known for its copper domes", "with the copper domes"),
    (["river town", "market town"], "where the ferryman is also the mayor", "where the ferryman is mayor"),
    (["village", "coastal village"], "built on the bones of a stranded whale", "built around the whale bones"),
    (["port", "harbour town"], "where a sunken galleon lies in the bay", "with the sunken galleon"),
    (["town", "city"], "whose university teaches only astronomy", "with the astronomy university"),
    (["valley", "village"], "where hot springs steam in the winter air", "with the hot springs"),
    (["island", "village"], "where the post arrives once a month by seaplane", "served by the seaplane"),
    (["forest village", "town"], "famous for carved wooden masks", "known for carved masks"),
    (["hill town", "city"], "whose staircase streets have over a thousand steps", "with a thousand steps"),
]
LEAD_FRAMES = [
    "Travellers often speak of a {kind} {clause}.",
    "Somewhere far to the north lies a {kind} {clause}.",
    "Old sea charts mark a {kind} {clause}.",
    "My grandmother grew up in a {kind} {clause}.",
    "There is a {kind} {clause}.",
    "Every guidebook mentions a {kind} {clause}.",
    "Last summer we stayed in a {kind} {clause}.",
    "Few people have visited the {kind} {clause}.",
]
QUESTION_FRAMES = [
    "The {kind} {feature} is called",
    "The name of the {kind} {feature} is",
    "So, the {kind} {feature} is known as",
    "Remember the {kind} {feature}? It is named",
]


def make_intros(rng):
    intros = []
    for f_index, (kinds, clause, feature) in enumerate(FEATURES):
        for k_index, kind in enumerate(kinds):
            lead = LEAD_FRAMES[(f_index + 3 * k_index) % len(LEAD_FRAMES)]
            question = QUESTION_FRAMES[(f_index * 2 + k_index) % len(QUESTION_FRAMES)]
            intros.append({
                "location_intro": with_articles(lead.format(kind=kind, clause=clause)) + " The place is:",
                "tieback_question": question.format(kind=kind, feature=feature),
            })
    rng.shuffle(intros)
    return intros


# --- philosophical statements: an abstract subject and a reflection that suits any of them ---
PHILO_SUBJECTS = ["Patience", "Memory", "Doubt", "Courage", "Solitude", "Kindness", "Curiosity",
                  "Grief", "Freedom", "Habit", "Silence", "Hope"]
PHILO_PREDICATES = [
    "is less a possession than a practice repeated each morning.",
    "reveals more about the one who seeks it than about the world.",
    "cannot be taught directly, only shown by example.",
    "grows quietly in the spaces between our certainties.",
    "is often mistaken for its opposite by those in a hurry.",
    "asks nothing of us except that we notice it.",
    "becomes heavier when we pretend it is not there.",
    "is the long shadow cast by what we truly value.",
    "turns ordinary days into something worth remembering.",
    "is measured not in years but in the choices it shapes.",
]

# --- culinary statements ---
FOOD_DISHES = ["A stew of lentils and smoked paprika", "Fresh bread with a thick crust",
               "A salad of bitter greens and roasted pears", "Rice cooked slowly in saffron broth",
               "A tart of sour cherries", "Grilled mackerel with lemon", "A plate of dumplings filled with leeks",
               "A soup of roasted pumpkin", "Flatbread brushed with garlic oil",
               "A custard flavoured with cardamom", "A bowl of noodles tossed in sesame and chili",
               "A dish of baked apples stuffed with walnuts"]
FOOD_REMARKS = [
    "tastes even better on the second day.",
    "is best shared at a long table with friends.",
    "needs only a pinch of salt to come alive.",
    "rewards the cook who refuses to hurry.",
    "pairs well with a glass of cold cider.",
    "fills the whole kitchen with a warm smell.",
    "was once considered food for special occasions.",
    "is simple to make but hard to perfect.",
    "tastes of the season in which it is cooked.",
    "should be eaten while it is still steaming.",
]

# --- math problems: (frame, operator, operand generator); the equation is part of the sentence ---
MATH_FRAMES = [
    ("A farmer has {a} sheep and buys {b} more, so {a} + {b} = {c} sheep graze now.", "+"),
    ("A library held {a} books and lent out {b}, leaving {a} - {b} = {c} on the shelves.", "-"),
    ("There are {a} crates with {b} jars each, which makes {a} × {b} = {c} jars in total.", "×"),
    ("Sharing {a} marbles equally among {b} children gives {a} ÷ {b} = {c} marbles each.", "÷"),
    ("A train travels {a} km in the morning and {b} km later: {a} + {b} = {c} km.", "+"),
    ("A baker made {a} rolls and sold {b}; {a} - {b} = {c} rolls remain.", "-"),
    ("A garden has {a} rows of {b} tulips, so it holds {a} × {b} = {c} tulips.", "×"),
    ("Cutting a {a} cm ribbon into {b} equal parts gives {a} ÷ {b} = {c} cm pieces.", "÷"),
]


# The operand ranges of each operator: (low, high) of a and b for + and ×, of a and then of b
# below a for -, and of the divisor b and the quotient c for ÷ (a = b * c, so it divides).
MATH_RANGES = {"+": (3, 99), "-": (20, 150), "×": (2, 15), "÷": ((2, 12), (2, 15))}


def operands(rng, op, ranges):
    """(a, b, c) with a op b = c, drawn in a fixed order (the pools are a function of the seed)."""
    if op == "+":
        a, b = rng.randint(*ranges["+"]), rng.randint(*ranges["+"])
        return a, b, a + b
    if op == "-":
        a = rng.randint(*ranges["-"])
        b = rng.randint(1, a - 1)
        return a, b, a - b
    if op == "×":
        a, b = rng.randint(*ranges["×"]), rng.randint(*ranges["×"])
        return a, b, a * b
    b, c = rng.randint(*ranges["÷"][0]), rng.randint(*ranges["÷"][1])
    return b * c, b, c


def make_math(rng, count):
    problems, seen = [], set()
    while len(problems) < count:
        frame, op = MATH_FRAMES[len(problems) % len(MATH_FRAMES)]
        a, b, c = operands(rng, op, MATH_RANGES)
        text = frame.format(a=a, b=b, c=c)
        if text not in seen:
            seen.add(text)
            problems.append(text)
    return problems


EQUATION = re.compile(r"(\d+) ([-+×÷]) (\d+) = (\d+)")


def check_math(problems):
    for i, text in enumerate(problems):
        found = EQUATION.findall(text)
        if len(found) != 1:
            sys.exit(f"math_problems[{i}]: expected one equation, found {len(found)}: {text}")
        a, op, b, c = found[0]
        a, b, c = int(a), int(b), int(c)
        value = {"+": a + b, "-": a - b, "×": a * b, "÷": a // b if a % b == 0 else None}[op]
        if value != c:
            sys.exit(f"math_problems[{i}]: arithmetic is wrong: {text}")


def make_pools():
    rng = random.Random(SEED)
    pools = {
        "location_names": make_location_names(rng, 120),
        "loc_intro_tieback_list": make_intros(rng),
        "philosophy_statements": [s + " " + p for s in PHILO_SUBJECTS for p in PHILO_PREDICATES],
        "food_descriptions": [d + " " + r for d in FOOD_DISHES for r in FOOD_REMARKS],
        "math_problems": make_math(rng, 120),
    }
    rng.shuffle(pools["philosophy_statements"])
    rng.shuffle(pools["food_descriptions"])
    check_math(pools["math_problems"])
    for key, values in pools.items():
        keyed = [json.dumps(v, sort_keys=True) for v in values]
        if len(set(keyed)) != len(keyed):
            sys.exit(f"{key}: duplicate entries")
        if len(values) < 100:
            sys.exit(f"{key}: only {len(values)} entries, expected at least 100")
    for entry in pools["loc_intro_tieback_list"]:
        assert entry["location_intro"].endswith("The place is:")
    return pools


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(root, "assets/benchmarks/coref/pools.json"))
    parser.add_argument("--check", action="store_true",
                        help="only verify that --out matches what this script generates")
    args = parser.parse_args()
    text = json.dumps(make_pools(), indent=1, ensure_ascii=False) + "\n"
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit(f"{args.out} is out of date; rerun tools/make_coref_pools.py")
        return
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print({k: len(v) for k, v in make_pools().items()})


if __name__ == "__main__":
    main()
