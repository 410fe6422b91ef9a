#!/usr/bin/env python3
"""Writes the co-reference pools the demo model is trained and selected on: large pools of the
project's own making whose names, places and problems are new, so a model can only answer by copying.

Why: a model trained on samples drawn from the 120 bundled names learns those names, not the
copy (it scored 1.00 on the bundled pools and 0.00 on the TokenButler paper's). Here every sample
can get a name it has never met: --names names (default 60,000) from five styles (invented words
from a syllable inventory unlike the bundled one, in lower or title case; compounds of two English
morphemes, e.g. "thornreach"; a word with a landform, e.g. "Lake Vadrimo"; hyphenated pairs;
apostrophe names), leads and tie-back questions composed from clauses (wh-questions as in the
paper's file and "... is called" ones as in the bundled file), and distractors: reflections and
dishes composed from parts, and arithmetic in new wordings (checked before writing).

Splits (same generator, disjoint parts): `train` and `select` draw names from one stream and split
it, so no name is in both; `select` also keeps back a share of the clause parts and frames, so
choosing a checkpoint on it measures leads never trained on. --exclude FILE (repeatable, pools
JSON) drops names equal to one of that file's (case-insensitive): the evaluation pools stay unseen.
Deterministic (stdlib only, fixed seed): the same arguments give the same file.
--ornate-share S makes that share of the leads long scenes whose questions paraphrase them, and of
the distractor sentences long ones (the paper's manner; see make_ornate_intros).
Usage: python3 tools/make_training_pools.py --split train --out FILE [--names N] [--exclude F]
       [--pieces-of TOKENIZER_JSON] [--ornate-share 0.5]
"""

import argparse
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_coref_pools import check_math, operands  # noqa: E402  (the same arithmetic)

SEED = 41_2026

# --- names -------------------------------------------------------------------------------------
ONSETS = ["", "b", "c", "ch", "d", "dr", "f", "fl", "g", "gr", "h", "j", "k", "l", "m", "n", "p",
          "pl", "r", "s", "sh", "sl", "sp", "t", "tr", "v", "vr", "y", "z", "zh", "ph", "cr", "bl"]
NUCLEI = ["a", "e", "i", "o", "u", "ai", "ei", "io", "ea", "oa", "ui", "y", "ia", "eo", "au"]
CODAS = ["", "", "", "n", "r", "l", "s", "x", "nth", "rn", "lt", "ck", "ss", "mb", "ng", "z", "d"]
MORPHEMES_FIRST = [
    "ash", "ember", "frost", "gloam", "thorn", "brook", "storm", "mist", "moon", "star", "dawn",
    "bright", "silver", "raven", "willow", "amber", "iron", "hollow", "glimmer", "fern", "briar",
    "cinder", "copper", "dew", "drift", "elm", "fallow", "flint", "gold", "hazel", "heather",
    "ivy", "jade", "kestrel", "lark", "marrow", "night", "oak", "pebble", "quill", "rime", "rowan",
    "rust", "sable", "salt", "sorrow", "spindle", "tallow", "thistle", "umber", "vesper", "wander",
    "wren", "yarrow", "cobble", "cloud", "hearth", "lantern", "pine", "shale", "smoke", "sun",
    "tide", "velvet", "winter", "bramble", "crow", "gale", "loam", "moss", "nettle", "opal"]
MORPHEMES_LAST = [
    "reach", "hold", "fell", "wick", "stead", "haven", "spire", "glen", "crest", "fall", "shade",
    "wood", "holm", "cairn", "ford", "gate", "hollow", "march", "mouth", "ridge", "field", "marsh",
    "thwaite", "bury", "combe", "dale", "delve", "fold", "garth", "hithe", "keep", "knoll", "lea",
    "mire", "more", "nook", "rise", "shaw", "strand", "tarn", "ton", "well", "wold", "yard",
    "bourne", "burrow", "cliff", "drift", "harbor", "hearth", "port", "rock", "sound", "vale"]
LANDFORMS_BEFORE = ["Lake", "Mount", "Port", "Cape", "Isle of", "Fort", "Glen", "Saint"]
LANDFORMS_AFTER = ["Bay", "Point", "Sound", "Hills", "Falls", "Cove", "Springs", "Harbor", "Pass",
                   "Ridge", "Basin", "Flats", "Grove", "Shoals", "Commons", "Rapids"]


def invented(rng):
    syllables = rng.choice([2, 2, 3, 3, 4])
    word = ""
    for i in range(syllables):
        word += rng.choice(ONSETS) + rng.choice(NUCLEI)
        if i == syllables - 1 or rng.random() < 0.25:
            word += rng.choice(CODAS)
    return word


def cased(rng, word):
    return word.capitalize() if rng.random() < 0.5 else word.lower()


def vocabulary_pieces(path, parity):
    """Lower-case alphabetic pieces (2-6 letters) of a tokenizer.json's vocabulary whose id has
    the given parity: train names are built from even ids, select names from odd ones, so a
    selected checkpoint has copied pieces it never saw inside a name."""
    with open(path, encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    return sorted(piece for piece, i in vocab.items()
                  if i % 2 == parity and piece.isascii() and piece.isalpha() and piece.islower()
                  and 2 <= len(piece) <= 6)


def piece_name(rng, pieces):
    """Two to four vocabulary pieces glued together: each piece is as unpredictable as the next,
    so only copying the earlier mention gives the answer (syllable inventories are learnable)."""
    return cased(rng, "".join(rng.choice(pieces) for _ in range(rng.choice([2, 2, 3, 3, 4]))))


def make_name(rng, pieces):
    style = rng.random()
    if pieces and style < 0.5:
        return piece_name(rng, pieces)
    style = rng.random()
    if style < 0.35:
        return cased(rng, invented(rng))
    if style < 0.65:
        return cased(rng, rng.choice(MORPHEMES_FIRST) + rng.choice(MORPHEMES_LAST))
    if style < 0.85:
        word = invented(rng).capitalize() if rng.random() < 0.6 else (
            rng.choice(MORPHEMES_FIRST) + rng.choice(MORPHEMES_LAST)).capitalize()
        if rng.random() < 0.5:
            return rng.choice(LANDFORMS_BEFORE) + " " + word
        return word + " " + rng.choice(LANDFORMS_AFTER)
    if style < 0.93:
        return invented(rng).capitalize() + "-" + invented(rng).capitalize()
    return invented(rng).capitalize() + "'" + invented(rng)


def make_names(rng, count, excluded, pieces):
    names, seen = [], set(excluded)
    while len(names) < count:
        name = make_name(rng, pieces)
        letters = re.sub(r"[^A-Za-z]", "", name)
        if not 4 <= len(letters) <= 18 or name.lower() in seen:
            continue
        seen.add(name.lower())
        names.append(name)
    return names


# --- leads and tie-backs -------------------------------------------------------------------------
# A feature is composed as "<colour> <things> <action>"; the lead describes it in a clause and the
# question names it again (sharing its content words, as validate_pool_integrity requires).
COLOURS = ["amber", "silver", "crimson", "violet", "emerald", "ivory", "cobalt", "golden",
           "scarlet", "pale", "charcoal", "copper", "indigo", "rose", "saffron", "turquoise",
           "ochre", "pearl", "jet-black", "lilac", "bronze", "sea-green", "snow-white", "rust-red"]
THINGS = ["herons", "lanterns", "bells", "foxes", "moths", "wolves", "ships", "kites", "stones",
          "towers", "orchards", "ferns", "owls", "horses", "bridges", "windmills", "statues",
          "fountains", "beehives", "banners", "boats", "lilies", "goats", "chimneys", "mushrooms",
          "butterflies", "pines", "cranes", "tents", "crystals", "pigeons", "shutters"]
ACTIONS = ["gather at dusk", "hang from every roof", "ring at midnight", "sleep on the rocks",
           "drift over the water", "glow after sunset", "appear before storms",
           "line the only road", "crowd the market square", "fill the northern valley",
           "stand along the harbour", "shine under the full moon", "cover the eastern hills",
           "guard the old gate", "circle the bell tower", "rest beside the river",
           "climb the cliff paths", "surround the ruined abbey", "float on the lake",
           "watch over the graveyard", "decorate the town hall", "dot the salt flats"]
KINDS = ["town", "village", "harbour", "island", "valley", "city", "hamlet", "port", "oasis",
         "settlement", "kingdom", "realm", "outpost", "citadel", "monastery", "archipelago",
         "canyon", "plateau", "forest", "marsh", "glade", "province", "fortress", "lagoon"]
OPENINGS = [
    "Far beyond the {direction} mountains lies a {kind} where {feature}.",
    "Sailors tell stories of a {kind} where {feature}.",
    "On the oldest maps there is a {kind} where {feature}.",
    "Hidden between two rivers is a {kind} where {feature}.",
    "At the end of a long dusty road you reach a {kind} where {feature}.",
    "Pilgrims still travel to a {kind} where {feature}.",
    "Nobody forgets the {kind} where {feature}.",
    "In the {direction} there is a quiet {kind} where {feature}.",
    "Beyond the last lighthouse sits a {kind} where {feature}.",
    "My uncle once painted a {kind} where {feature}.",
    "Every child in the region has heard of a {kind} where {feature}.",
    "Across the frozen sea stands a {kind} where {feature}.",
]
DIRECTIONS = ["north", "south", "east", "west", "far north", "deep south"]
SECOND_SENTENCES = [
    "The air smells of {smell}, and {sound} can be heard from far away.",
    "Visitors arrive by {travel}, and most of them stay longer than they planned.",
    "Its people are known for {custom}, and strangers are welcomed with {gift}.",
    "In winter the roads close, and the only way in is by {travel}.",
    "The evenings are long and {weather}, and the streets are lit by {light}.",
    "Old songs say it was founded by {founder} who lost their way.",
]
SMELLS = ["pine resin", "sea salt", "baking bread", "wet stone", "wild thyme", "woodsmoke"]
SOUNDS = ["distant drums", "the cries of gulls", "a lone flute", "rushing water", "church bells"]
TRAVELS = ["sledge", "ferry", "a narrow mountain train", "river barge", "a rope bridge", "mule"]
CUSTOMS = ["their riddles", "their patience", "their weaving", "their long silences", "their feasts"]
GIFTS = ["warm cider", "a loaf of bread", "a sprig of rosemary", "a small carved bird", "salt"]
WEATHERS = ["misty", "golden", "windy", "warm", "bitterly cold", "strangely bright"]
LIGHTS = ["paper lanterns", "oil lamps", "glowing fungi", "torches", "strings of candles"]
FOUNDERS = ["two sisters", "a band of shepherds", "a shipwrecked captain", "wandering monks"]
QUESTIONS = [
    "What is the name of the {kind} where {feature}?",
    "Which {kind} is the one where {feature}?",
    "Do you recall the {kind} where {feature}? It is called",
    "The {kind} where {feature} is called",
    "Name the {kind} where {feature}.",
    "Which place, a {kind}, is known because {feature}?",
    "And the {kind} where {feature}? Its name is",
    "Where do {feature_np}? The answer is",
]


def with_articles(text):
    words = text.split(" ")
    for i in range(len(words) - 1):
        if words[i] in ("a", "A") and words[i + 1][:1].lower() in "aeiou":
            words[i] += "n"
    return " ".join(words)


def fill_second(rng, frame):
    return frame.format(smell=rng.choice(SMELLS), sound=rng.choice(SOUNDS),
                        travel=rng.choice(TRAVELS), custom=rng.choice(CUSTOMS),
                        gift=rng.choice(GIFTS), weather=rng.choice(WEATHERS),
                        light=rng.choice(LIGHTS), founder=rng.choice(FOUNDERS))


def split_parts(rng, parts, select):
    """The select split keeps back the last quarter of a shuffled copy; train gets the rest."""
    parts = list(parts)
    random.Random(SEED + len(parts)).shuffle(parts)
    cut = max(1, len(parts) // 4)
    return parts[:cut] if select else parts[cut:]


def make_intros(rng, count, select):
    colours, things = split_parts(rng, COLOURS, select), split_parts(rng, THINGS, select)
    actions, kinds = split_parts(rng, ACTIONS, select), split_parts(rng, KINDS, select)
    openings, questions = split_parts(rng, OPENINGS, select), split_parts(rng, QUESTIONS, select)
    if select:  # a held-back frame alone could not vary enough: add one of each seen ones
        openings, questions = openings + OPENINGS[:1], questions + QUESTIONS[:2]
    intros, seen = [], set()
    for _ in range(count * 50):
        if len(intros) >= count:
            break
        colour, thing, action = rng.choice(colours), rng.choice(things), rng.choice(actions)
        kind = rng.choice(kinds)
        feature = f"{colour} {thing} {action}"
        key = (feature, kind)
        if key in seen:
            continue
        seen.add(key)
        lead = rng.choice(openings).format(kind=kind, feature=feature,
                                           direction=rng.choice(DIRECTIONS))
        if rng.random() < 0.7:
            lead += " " + fill_second(rng, rng.choice(SECOND_SENTENCES))
        question = rng.choice(questions).format(kind=kind, feature=f"the {feature}",
                                                feature_np=f"the {feature}")
        intros.append({"location_intro": with_articles(lead) + " The place is:",
                       "tieback_question": with_articles(question)})
    if len(intros) < count:
        sys.exit(f"only {len(intros)} distinct leads could be composed, {count} asked")
    return intros


# --- ornate scenes with paraphrased tie-backs ----------------------------------------------------
# The plain leads above repeat their feature word for word in the question, and a model trained on
# them only matched strings: it scored 0.23 on the TokenButler paper's long, ornate leads whose
# questions paraphrase them, and 1.00 on plain leads with the paper's names in them. A scene has a
# setting, a centrepiece (an amount, a colour, a thing and what it does) and a sky; the lead says
# them in long sentences with embellishment, the question names two or three of them in other
# words (each part lists the lead's wording first, then paraphrases), so only meaning ties them.
# (lead wording, [question wordings...])
SETTINGS = [
    ("between two snow-capped mountains", ["between two snowy peaks", "among snow-capped mountains"]),
    ("on the shore of a silent lake", ["beside a still lake", "by a silent lake"]),
    ("at the heart of an ancient forest", ["deep in an old forest", "inside an ancient forest"]),
    ("along the rim of a vast canyon", ["on the edge of a great canyon", "beside a vast canyon"]),
    ("in a valley hidden by mist", ["in a misty valley", "in a valley veiled by fog"]),
    ("upon a cliff above the restless sea", ["on cliffs above the sea", "high over the sea"]),
    ("among dunes of pale sand", ["in the sand dunes", "among pale dunes"]),
    ("beneath a frozen waterfall", ["under a frozen waterfall", "below a waterfall of ice"]),
    ("on an island ringed by coral", ["on a coral island", "on an island of coral reefs"]),
    ("within the crater of a sleeping volcano", ["inside a dormant volcano", "in a volcano's crater"]),
    ("across a plain of black glass", ["on a plain of dark glass", "across a glassy black plain"]),
    ("in a marsh where the reeds grow tall", ["in a reedy marsh", "among the tall marsh reeds"]),
    ("high on a plateau swept by wind", ["on a windswept plateau", "atop a windy plateau"]),
    ("at the bottom of a deep green gorge", ["in a green gorge", "deep within a gorge"]),
    ("on the slopes of a terraced hillside", ["on terraced hills", "on a stepped hillside"]),
    ("inside a cavern larger than a city", ["in a vast cavern", "in an enormous cave"]),
]
AMOUNTS = ["a sea of", "a field of", "a glowing field of", "countless", "a thousand", "rows of",
           "clusters of", "a ring of", "a maze of", "endless", "a quiet grove of", "great drifts of"]
# (lead colour, [question colours...])
ORNATE_COLOURS = [
    ("sapphire", ["blue", "sapphire"]), ("crimson", ["red", "crimson"]),
    ("golden", ["gold", "golden"]), ("emerald", ["green", "emerald"]),
    ("violet", ["purple", "violet"]), ("silver", ["silvery", "silver"]),
    ("amber", ["amber", "honey-coloured"]), ("ivory", ["white", "ivory"]),
    ("obsidian", ["black", "obsidian"]), ("turquoise", ["blue-green", "turquoise"]),
    ("copper", ["copper", "reddish-brown"]), ("rose", ["pink", "rose-coloured"]),
    ("jade", ["green", "jade"]), ("scarlet", ["bright red", "scarlet"]),
]
ORNATE_THINGS = [
    ("flowers", ["blossoms", "flowers", "blooms"]), ("trees", ["trees"]),
    ("stones", ["stones", "rocks"]), ("lanterns", ["lanterns", "lamps"]),
    ("mushrooms", ["mushrooms", "fungi"]), ("crystals", ["crystals", "gems"]),
    ("vines", ["vines", "creepers"]), ("pillars", ["pillars", "columns"]),
    ("statues", ["statues", "carvings"]), ("bells", ["bells", "chimes"]),
    ("ferns", ["ferns"]), ("pools", ["pools", "ponds"]), ("reeds", ["reeds", "rushes"]),
    ("lilies", ["lilies", "water lilies"]), ("shells", ["shells", "seashells"]),
    ("arches", ["arches", "archways"]), ("feathers", ["feathers", "plumes"]),
    ("birds", ["birds", "songbirds"]),
]
ORNATE_ACTIONS = [
    ("ripple like waves in the wind", ["sway like waves", "ripple in the wind"]),
    ("glow softly after nightfall", ["shine at night", "glow in the dark"]),
    ("hum a low song at dawn", ["sing at daybreak", "hum at sunrise"]),
    ("change colour with the seasons", ["shift hue with the seasons", "change colour each season"]),
    ("float a hand's width above the ground", ["hover above the ground", "float in the air"]),
    ("shimmer whenever rain falls", ["sparkle in the rain", "shimmer when it rains"]),
    ("whisper when the wind passes", ["murmur in the breeze", "whisper in the wind"]),
    ("turn slowly to follow the moon", ["follow the moon", "turn toward the moon"]),
    ("cast long blue shadows at noon", ["throw blue shadows", "cast blue shadows"]),
    ("bloom only once a century", ["flower once every hundred years", "bloom once in a century"]),
    ("chime faintly at every dusk", ["ring softly at twilight", "chime at dusk"]),
    ("sparkle like scattered stars", ["glitter like stars", "twinkle like stars"]),
    ("rise from the mist each morning", ["emerge from the morning fog", "appear out of the mist"]),
    ("drift lazily across the water", ["float across the water", "drift on the water"]),
    ("sing whenever travellers approach", ["sing to visitors", "sing as strangers come near"]),
    ("shed warm light on the snow", ["light up the snow", "warm the snow with light"]),
]
SKIES = [
    ("under the light of twin suns", ["beneath two suns", "under twin suns"]),
    ("beneath a sky of lavender and gold", ["under a lavender sky", "below a golden, lavender sky"]),
    ("under three pale moons", ["beneath three moons", "under three moons"]),
    ("where the northern lights never fade", ["under endless northern lights",
                                              "where the aurora never fades"]),
    ("beneath a sky that is always dusk", ["in everlasting twilight", "under an endless dusk"]),
    ("under a ring of falling stars", ["beneath falling stars", "under showers of stars"]),
    ("where it rains only at night", ["where rain falls only at night", "where it rains by night"]),
    ("beneath a copper-coloured sky", ["under a copper sky", "beneath a reddish sky"]),
    ("where the sun never fully sets", ["under a sun that never sets", "where the sun never sets"]),
    ("in a land of endless fog", ["in endless fog", "where the fog never lifts"]),
    ("under a sky streaked with green fire", ["under green fire in the sky",
                                              "beneath a sky of green flame"]),
    ("beneath a moon that glows violet", ["under a violet moon", "beneath a purple moon"]),
]
ORNATE_LEADS = [
    "{Setting} lies {amount} {colour} {thing} that {action}, {sky}.",
    "{Sky}, {amount} {colour} {thing} {action} {setting}.",
    "There is a place {setting} where {amount} {colour} {thing} {action} {sky}.",
    "Picture {amount} {colour} {thing} that {action} {setting}, {sky}.",
    "Those who wander {setting} find {amount} {colour} {thing} that {action} {sky}.",
    "Cradled {setting}, {amount} {colour} {thing} {action} {sky}.",
    "Legends speak of a realm {setting}, {sky}, where {amount} {colour} {thing} {action}.",
    "Far from any road, {setting}, {amount} {colour} {thing} {action} {sky}.",
]
EMBELLISHMENTS = [
    "As twilight descends, the air fills with {sound} and the scent of {smell}.",
    "Ancient whispers linger in every corner, and fireflies dance through the {weather} air.",
    "Travellers who reach it speak of a stillness so deep that time itself seems to pause.",
    "It is a breathtaking tapestry of light and shadow, woven from forgotten enchantments.",
    "The few who have seen it return quieter, as if they had been told a secret.",
    "Every breeze carries {sound}, and the ground beneath is soft with {smell}-scented moss.",
    "Poets have tried for centuries to describe it, and every one of them has failed.",
    "Its beauty is almost unbearable in the {weather} hours just before dawn.",
]
ORNATE_ADJECTIVES = ["enchanting", "mysterious", "mystical", "remarkable", "hidden", "legendary",
                     "magical", "wondrous", "secluded", "fabled", "dreamlike", "serene"]
PLACE_WORDS = ["location", "place", "realm", "land", "destination", "spot", "region", "haven"]
# Each names two or three parts: {centre} = colour + thing, {thing} alone, {action}, {setting}, {sky}
ORNATE_QUESTIONS = [
    "What {adj} {place} features {centre} that {action}?",
    "Which {adj} {place} has {centre} {sky}?",
    "Where do {centre} {action} {setting}?",
    "What is the name of the {adj} {place} {setting} where {thing} {action}?",
    "Name the {place} known for {centre} {sky}.",
    "Which {place} {setting} is home to {thing} that {action}?",
    "Do you remember the {adj} {place} with {centre}, {sky}? It was",
    "The {place} where {thing} {action} {sky} was called",
    "What {place}, {setting}, is famous for its {centre}?",
    "Which {adj} {place} is it where {centre} {action}?",
]


# engine/eval/coref_pools.cpp's stop words: the pools' integrity check ignores these.
STOP_WORDS = {
    "about", "also", "been", "being", "called", "does", "each", "even", "from", "have", "here",
    "into", "just", "known", "like", "more", "most", "much", "name", "named", "only", "over",
    "place", "same", "some", "such", "than", "that", "their", "them", "then", "there", "these",
    "they", "this", "those", "very", "were", "what", "when", "where", "which", "while", "whose",
    "will", "with", "would", "your", "remember"}


def content_words(text):
    return set(re.findall(r"[a-z]{4,}", text.lower())) - STOP_WORDS


def paraphrase(rng, entry):
    """A question wording of a (lead, [paraphrases]) part: a paraphrase three times in four."""
    return rng.choice(entry[1]) if rng.random() < 0.75 else entry[0]


def make_ornate_intros(rng, count, select):
    settings, colours = split_parts(rng, SETTINGS, select), split_parts(rng, ORNATE_COLOURS, select)
    things, actions = split_parts(rng, ORNATE_THINGS, select), split_parts(rng, ORNATE_ACTIONS, select)
    skies, leads = split_parts(rng, SKIES, select), split_parts(rng, ORNATE_LEADS, select)
    questions = split_parts(rng, ORNATE_QUESTIONS, select)
    if select:
        leads, questions = leads + ORNATE_LEADS[:1], questions + ORNATE_QUESTIONS[:2]
    intros, seen = [], set()
    for _ in range(count * 50):
        if len(intros) >= count:
            break
        setting, colour, thing = rng.choice(settings), rng.choice(colours), rng.choice(things)
        action, sky = rng.choice(actions), rng.choice(skies)
        key = (setting[0], colour[0], thing[0], action[0], sky[0])
        if key in seen:
            continue
        seen.add(key)
        lead = rng.choice(leads).format(
            setting=setting[0], Setting=setting[0][0].upper() + setting[0][1:],
            amount=rng.choice(AMOUNTS), colour=colour[0], thing=thing[0], action=action[0],
            sky=sky[0], Sky=sky[0][0].upper() + sky[0][1:])
        for _ in range(rng.randint(0, 2)):
            lead += " " + rng.choice(EMBELLISHMENTS).format(
                sound=rng.choice(SOUNDS), smell=rng.choice(SMELLS), weather=rng.choice(WEATHERS))
        thing_words = paraphrase(rng, thing)
        question = rng.choice(questions).format(
            adj=rng.choice(ORNATE_ADJECTIVES), place=rng.choice(PLACE_WORDS),
            centre=f"{paraphrase(rng, colour)} {thing_words}", thing=thing_words,
            action=paraphrase(rng, action), setting=paraphrase(rng, setting),
            sky=paraphrase(rng, sky))
        question = question[0].upper() + question[1:]
        if not content_words(lead) & content_words(question):
            continue  # all paraphrased: the pools' integrity check wants one shared word
        intros.append({"location_intro": with_articles(lead) + " The place is:",
                       "tieback_question": with_articles(question)})
    if len(intros) < count:
        sys.exit(f"only {len(intros)} distinct ornate leads could be composed, {count} asked")
    return intros


# --- distractors ---------------------------------------------------------------------------------
THINKERS = ["an old ferryman", "a retired astronomer", "the philosopher Ardel Venn",
            "a village teacher", "a monk of the mountain order", "a famous clockmaker",
            "the essayist Mirela Oduya", "a weary cartographer"]
VIRTUES = ["patience", "wonder", "doubt", "loyalty", "restraint", "honesty", "curiosity", "grief",
           "gratitude", "ambition", "forgiveness", "stillness"]
REFLECTIONS = [
    "{thinker} once wrote that {virtue} is a lamp we carry for others more than for ourselves.",
    "According to {thinker}, {virtue} grows only where it is given room and time.",
    "{thinker} argued that a life without {virtue} is like a map without a scale.",
    "It was {thinker} who said that {virtue} and {virtue2} are two doors to the same house.",
    "{thinker} believed that {virtue} cannot be hurried, only practised, day after day.",
    "To {thinker}, {virtue} was not a feeling but a habit of attention.",
]
DISHES = ["roasted chestnut soup", "barley bread with honey", "a pie of wild mushrooms",
          "smoked trout on rye", "lemon and poppy seed cake", "lamb stew with quince",
          "buckwheat pancakes", "a salad of fennel and orange", "spiced plum dumplings",
          "grilled corn with chili butter", "a gratin of leeks", "cardamom rice pudding"]
FOOD_FRAMES = [
    "The cook's {dish} was served warm, with {side}, and everyone asked for more.",
    "Nothing tastes of {season} quite like {dish} eaten beside {side}.",
    "Her recipe for {dish} calls for {side} and a great deal of patience.",
    "At the inn they offered {dish}, followed by {side}, before the long walk home.",
    "Few things are as comforting as {dish} on a {weather} evening, with {side}.",
]
SIDES = ["pickled cabbage", "fresh cream", "a pot of mint tea", "toasted almonds", "soft cheese",
         "a jug of cold cider", "sour cherries", "crusty bread"]
SEASONS = ["autumn", "winter", "spring", "late summer"]
MATH_FRAMES = [
    ("Take {a}, add {b} and you get {c}: {a} + {b} = {c}.", "+"),
    ("Is {a} minus {b} equal to {c}? Yes, because {a} - {b} = {c}.", "-"),
    ("If each of {a} boxes holds {b} pens, there are {a} × {b} = {c} pens.", "×"),
    ("Split {a} coins into {b} equal piles and each pile has {a} ÷ {b} = {c} coins.", "÷"),
    ("A hiker walked {a} miles and then {b} more, so {a} + {b} = {c} miles in all.", "+"),
    ("From {a} apples, {b} were eaten: {a} - {b} = {c} apples are left.", "-"),
]


# Long sentences in the manner of the paper's distractors (clauses, semicolons, a thinker named in
# passing), so a name must be carried across prose as dense as theirs.
ORNATE_REFLECTIONS = [
    "In the slow turning of the years, {thinker} came to see that {virtue} is less a possession "
    "than a practice; to hold it too tightly is to lose it, and to share it freely is to find it "
    "multiplied in the hands of strangers.",
    "Much as a river shapes the stone it passes over, {virtue} shapes the one who tends it, "
    "argued {thinker}, who believed that the smallest daily choices write the longest stories.",
    "Consider, as {thinker} did, that {virtue} and {virtue2} are not opposites but companions, "
    "each keeping the other honest through the long nights of doubt and the bright mornings of "
    "certainty.",
    "Perhaps the deepest lesson of {thinker} is that {virtue} cannot be taught by argument at "
    "all; it is caught, like a tune, from those who already carry it without knowing they do.",
]
ORNATE_FOOD = [
    "Nestled in a deep clay bowl, {dish} steams gently beside {side}, each mouthful carrying the "
    "warmth of kitchens where generations have gathered to trade stories over simmering pots.",
    "On a {weather} evening in {season}, nothing rivals {dish}, its aroma drifting through the "
    "house long before it reaches the table, where {side} waits to soften its richness.",
    "The first bite of {dish} is a quiet revelation: layers of flavour unfold slowly, and {side} "
    "adds a bright, surprising note that lingers long after the plate is empty.",
    "Served on chipped blue plates at the end of a long {season} day, {dish} with {side} tastes "
    "of patience, of borrowed recipes, and of hands that learned by watching rather than reading.",
]


def several(rng, make_one):
    """One to eight sentences: the paper's distractors are long, the bundled ones short, and the
    distance between a name and its question should vary over both."""
    return " ".join(make_one() for _ in range(rng.randint(1, 8)))


def make_reflections(rng, count, ornate_share=0.0):
    def one():
        v1, v2 = rng.sample(VIRTUES, 2)
        frames = ORNATE_REFLECTIONS if rng.random() < ornate_share else REFLECTIONS
        text = rng.choice(frames).format(thinker=rng.choice(THINKERS), virtue=v1, virtue2=v2)
        return text[0].upper() + text[1:]

    return distinct(count, lambda: several(rng, one))


def make_food(rng, count, ornate_share=0.0):
    def one():
        frames = ORNATE_FOOD if rng.random() < ornate_share else FOOD_FRAMES
        text = rng.choice(frames).format(dish=rng.choice(DISHES), side=rng.choice(SIDES),
                                              season=rng.choice(SEASONS),
                                              weather=rng.choice(WEATHERS))
        return text[0].upper() + text[1:]

    return distinct(count, lambda: several(rng, one))


def distinct(count, make_one):
    """`count` different entries from make_one, in the order first made."""
    out, seen = [], set()
    while len(out) < count:
        text = make_one()
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


# Wider than the bundled pools' ranges: other numbers than the bundled problems'.
MATH_RANGES = {"+": (2, 250), "-": (10, 300), "×": (2, 19), "÷": ((2, 15), (2, 20))}


def make_math(rng, count):
    def one():
        frame, op = rng.choice(MATH_FRAMES)
        a, b, c = operands(rng, op, MATH_RANGES)
        return frame.format(a=a, b=b, c=c)

    return distinct(count, one)


def excluded_names(paths):
    names = set()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            pools = json.load(f)
        names.update(n.lower() for n in pools.get("location_names", []))
    return names


def make_pools(split, name_count, intro_count, distractor_count, excluded, pieces_of=None,
               ornate_share=0.0):
    rng = random.Random(SEED)
    select = split == "select"
    # One name stream for both splits: select takes the first names, train the rest, so they are
    # disjoint by construction and the train file does not change when --names changes select's.
    select_names = 2000
    if pieces_of is None:
        names = make_names(rng, select_names + (0 if select else name_count), excluded, [])
        names = names[:select_names] if select else names[select_names:]
    else:
        # Select names are made first from odd-id pieces; train names from even-id pieces and
        # never equal to a select name.
        select_list = make_names(random.Random(SEED + 11), select_names, excluded,
                                 vocabulary_pieces(pieces_of, 1))
        if select:
            names = select_list
        else:
            names = make_names(rng, name_count, excluded | {n.lower() for n in select_list},
                               vocabulary_pieces(pieces_of, 0))
    rng = random.Random(SEED + (1 if select else 2))
    ornate_count = round(intro_count * ornate_share)
    pools = {
        "location_names": names,
        "loc_intro_tieback_list": make_intros(rng, intro_count - ornate_count, select),
        "philosophy_statements": make_reflections(rng, distractor_count, ornate_share),
        "food_descriptions": make_food(rng, distractor_count, ornate_share),
        "math_problems": make_math(rng, distractor_count),
    }
    if ornate_count:  # their own stream, so the plain part is the same with or without them
        ornate = make_ornate_intros(random.Random(SEED + (21 if select else 22)), ornate_count,
                                    select)
        merged = pools["loc_intro_tieback_list"] + ornate
        random.Random(SEED + 23).shuffle(merged)
        pools["loc_intro_tieback_list"] = merged
    check_math(pools["math_problems"])
    return pools


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=["train", "select"], required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--names", type=int, default=60000, help="train split's names")
    ap.add_argument("--intros", type=int, default=0, help="default: 4000 train, 400 select")
    ap.add_argument("--distractors", type=int, default=400, help="entries of each distractor pool")
    ap.add_argument("--pieces-of", default=None, metavar="TOKENIZER_JSON",
                    help="half the names are glued from this vocabulary's alphabetic pieces "
                         "(train: even ids, select: odd ids)")
    ap.add_argument("--exclude", action="append", default=[],
                    help="pools JSON whose location names must not appear (repeatable)")
    ap.add_argument("--ornate-share", type=float, default=0.0,
                    help="share of the leads that are ornate scenes with paraphrased questions, "
                         "and of the distractor sentences in the long manner (0-1)")
    args = ap.parse_args()
    if not 0.0 <= args.ornate_share <= 1.0:
        ap.error("--ornate-share must be between 0 and 1")
    intros = args.intros or (400 if args.split == "select" else 4000)
    pools = make_pools(args.split, args.names, intros, args.distractors,
                       excluded_names(args.exclude), args.pieces_of, args.ornate_share)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(pools, f, indent=0, ensure_ascii=False)
        f.write("\n")
    print(json.dumps({k: len(v) for k, v in pools.items()}))


if __name__ == "__main__":
    main()
