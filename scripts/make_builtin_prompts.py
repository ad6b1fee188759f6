"""Generate teacli/data/builtin/prompts.jsonl: 240 short writing/explaining prompts, each with
verifiable constraints that the rule reward (teacli/rewards/rule.py) grades, and
teacli/data/builtin/heldout_ext.jsonl: 96 more of the same kinds, for evaluation only.

Twelve task kinds × twenty hand-written subjects (prompts.jsonl), and × eight further subjects
(heldout_ext.jsonl, added later with its own RNG so prompts.jsonl did not change); the numbers in
each constraint (word ranges, bullet counts, ...) are drawn from a fixed-seed RNG, and the
instruction text states every constraint in plain words. Rerunning gives the same files byte for byte.

    python scripts/make_builtin_prompts.py          # rewrite the files
    python scripts/make_builtin_prompts.py --check  # exit 1 if a file is stale
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from teacli.data.normalize import normalize_messages, prompt_id
from teacli.rewards.rule import count_keyword, validate_constraints

OUT = Path(__file__).resolve().parents[1] / "teacli" / "data" / "builtin" / "prompts.jsonl"
OUT_EXT = OUT.with_name("heldout_ext.jsonl")
OUT_HARD = OUT.with_name("hard.jsonl")


def q(words: list[str]) -> str:
    quoted = [f'"{w}"' for w in words]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def word_range(rng: random.Random, options: list[tuple[int, int]]) -> tuple[str, dict]:
    lo, hi = rng.choice(options)
    return f"Use between {lo} and {hi} words.", {"type": "word_count", "min": lo, "max": hi}


# --------------------------------------------------------------------------- 1. explain to an audience
EXPLAIN = [
    ("how tides work", ["moon", "gravity"]),
    ("why the sky is blue", ["sunlight", "scatter"]),
    ("how vaccines train the immune system", ["immune", "antibody"]),
    ("what causes earthquakes", ["plate", "fault"]),
    ("how a refrigerator keeps food cold", ["heat", "compressor"]),
    ("why leaves change color in autumn", ["chlorophyll", "pigment"]),
    ("how bees make honey", ["nectar", "hive"]),
    ("what inflation is", ["price", "money"]),
    ("how GPS finds your location", ["satellite", "signal"]),
    ("why we have seasons", ["tilt", "orbit"]),
    ("how sourdough bread rises", ["yeast", "starter"]),
    ("what a black hole is", ["gravity", "light"]),
    ("how compound interest works", ["interest", "savings"]),
    ("how airplanes stay in the air", ["wing", "lift"]),
    ("how the heart pumps blood", ["heart", "oxygen"]),
    ("what causes thunder", ["lightning", "air"]),
    ("how solar panels make electricity", ["sunlight", "current"]),
    ("why bread goes stale", ["starch", "moisture"]),
    ("how a rainbow forms", ["light", "droplet"]),
    ("what a computer's memory does", ["data", "program"]),
]
AUDIENCES = ["a ten-year-old", "a curious grandparent", "a busy coworker", "a high-school student",
             "someone who has never studied science"]


def explain(i: int, rng: random.Random, table: list = EXPLAIN) -> tuple[str, list[dict]]:
    what, kws = table[i]
    audience = AUDIENCES[i % len(AUDIENCES)]
    wc_text, wc = word_range(rng, [(40, 80), (60, 100), (80, 120), (50, 90)])
    text = f"Explain {what} to {audience}. {wc_text} Mention the words {q(kws)}."
    constraints = [wc, {"type": "include_keywords", "keywords": kws}]
    if i % 2 == 0:
        text += " Do not use any commas."
        constraints.append({"type": "no_commas"})
    return text, constraints


# --------------------------------------------------------------------------- 2. bullet-point tips
TIPS = [
    ("staying focused while working from home", "desk"),
    ("keeping houseplants alive", "water"),
    ("saving money on groceries", "list"),
    ("preparing for a job interview", "practice"),
    ("sleeping better at night", "screen"),
    ("learning to cook simple meals", "recipe"),
    ("starting a running habit", "shoes"),
    ("packing light for a weekend trip", "bag"),
    ("reducing food waste at home", "leftovers"),
    ("writing a clear email", "subject"),
    ("making a small apartment feel bigger", "light"),
    ("studying for a big exam", "schedule"),
    ("hosting a relaxed dinner party", "guests"),
    ("caring for a new puppy", "routine"),
    ("taking better photos with a phone", "light"),
    ("learning a new language as an adult", "practice"),
    ("keeping a tidy kitchen", "counter"),
    ("staying safe on a solo hike", "map"),
    ("giving a short speech without notes", "audience"),
    ("making a long flight more comfortable", "water"),
]


def tips(i: int, rng: random.Random, table: list = TIPS) -> tuple[str, list[dict]]:
    activity, kw = table[i]
    n = rng.choice([3, 4, 5])
    hi = rng.choice([80, 100, 120])
    text = (f"Give exactly {n} practical tips for {activity}, as a bullet list with one tip per line "
            f"starting with \"- \". Keep the whole answer to at most {hi} words and mention the word \"{kw}\".")
    constraints = [{"type": "num_bullets", "n": n}, {"type": "word_count", "max": hi},
                   {"type": "include_keywords", "keywords": [kw]}]
    if i % 3 == 1:
        text += ' Avoid the words "very" and "really".'
        constraints.append({"type": "forbidden_words", "words": ["very", "really"]})
    return text, constraints


# --------------------------------------------------------------------------- 3. short emails
EMAILS = [
    ("your neighbor Maya", "Maya", "thanking her for lending you a ladder", ["ladder"]),
    ("your manager Tom", "Tom", "asking to move Thursday's meeting to Friday", ["meeting", "Friday"]),
    ("your friend Lena", "Lena", "inviting her to a picnic on Saturday", ["picnic", "Saturday"]),
    ("your cousin Raj", "Raj", "apologizing for missing his birthday dinner", ["birthday", "sorry"]),
    ("your former teacher Ms. Okafor", "Ms. Okafor", "asking for a recommendation letter", ["recommendation", "deadline"]),
    ("a new colleague named Priya", "Priya", "welcoming her to the team", ["team", "lunch"]),
    ("your landlord Mr. Chen", "Mr. Chen", "reporting a leaking kitchen tap", ["tap", "repair"]),
    ("your book club", "everyone", "suggesting next month's novel", ["novel", "vote"]),
    ("a customer named Alex", "Alex", "confirming that their order has shipped", ["order", "tracking"]),
    ("your coach Sam", "Sam", "explaining why you will miss practice", ["practice", "ankle"]),
    ("your sister Ana", "Ana", "congratulating her on her new job", ["job", "celebrate"]),
    ("the school principal", "Principal Diaz", "volunteering to help at the science fair", ["volunteer", "science"]),
    ("your dentist's office", "Dr. Patel", "asking to book a cleaning appointment", ["appointment", "morning"]),
    ("a conference organizer named Jo", "Jo", "asking whether the talks will be recorded", ["recording", "talk"]),
    ("your roommate Kim", "Kim", "proposing a weekly cleaning schedule", ["schedule", "kitchen"]),
    ("a local bakery", "bakery team", "ordering a cake for an office party", ["cake", "Friday"]),
    ("your mentor Grace", "Grace", "sharing an update on your first project", ["project", "feedback"]),
    ("your old friend Marco", "Marco", "suggesting a video call to catch up", ["call", "weekend"]),
    ("a hotel front desk", "front desk team", "asking for a late checkout", ["checkout", "noon"]),
    ("your running group", "runners", "announcing a new Sunday route", ["route", "Sunday"]),
]
SIGN_OFFS = ["Best regards, Jordan", "Warm wishes, Jordan", "Thanks again, Jordan", "See you soon, Jordan"]


def email(i: int, rng: random.Random, table: list = EMAILS) -> tuple[str, list[dict]]:
    who, name, purpose, kws = table[i]
    greeting = f"Hi {name}," if i % 2 else f"Dear {name},"
    sign = SIGN_OFFS[i % len(SIGN_OFFS)]
    wc_text, wc = word_range(rng, [(50, 90), (60, 110), (40, 80)])
    text = (f"Write a short email to {who} {purpose}. Start with \"{greeting}\" and end with \"{sign}\". "
            f"{wc_text} Mention the words {q(kws)}.")
    return text, [{"type": "start_with", "text": greeting}, {"type": "ends_with", "text": sign}, wc,
                  {"type": "include_keywords", "keywords": kws}]


# --------------------------------------------------------------------------- 4. product descriptions
PRODUCTS = [
    ("a reusable steel water bottle", ["steel", "cold"]),
    ("a pair of noise-cancelling headphones", ["battery", "quiet"]),
    ("a handmade ceramic mug", ["glaze", "coffee"]),
    ("a solar-powered garden lamp", ["solar", "night"]),
    ("a waterproof hiking backpack", ["waterproof", "pocket"]),
    ("a cast-iron skillet", ["iron", "heat"]),
    ("a wooden puzzle for toddlers", ["wood", "colors"]),
    ("a folding electric scooter", ["battery", "fold"]),
    ("a wool winter scarf", ["wool", "warm"]),
    ("a desk lamp with adjustable brightness", ["brightness", "desk"]),
    ("a set of bamboo cutting boards", ["bamboo", "knife"]),
    ("a compact travel umbrella", ["wind", "compact"]),
    ("a smart plant-watering sensor", ["soil", "phone"]),
    ("a linen tablecloth", ["linen", "wash"]),
    ("an insulated lunch box", ["lunch", "insulated"]),
    ("a beginner watercolor paint set", ["brush", "paper"]),
    ("a pair of trail running shoes", ["grip", "trail"]),
    ("a portable phone charger", ["charge", "pocket"]),
    ("a weighted sleep blanket", ["sleep", "weight"]),
    ("a kitchen herb-growing kit", ["basil", "seeds"]),
]


def product(i: int, rng: random.Random, table: list = PRODUCTS) -> tuple[str, list[dict]]:
    item, kws = table[i]
    wc_text, wc = word_range(rng, [(40, 70), (50, 80), (60, 100)])
    text = f"Write an online-shop product description for {item}. {wc_text} Mention {q(kws)}."
    constraints = [wc, {"type": "include_keywords", "keywords": kws}]
    if i % 2:
        text += " Do not use any commas."
        constraints.append({"type": "no_commas"})
    else:
        text += ' Do not use the words "best" or "amazing".'
        constraints.append({"type": "forbidden_words", "words": ["best", "amazing"]})
    return text, constraints


# --------------------------------------------------------------------------- 5. lowercase poems
POEMS = [
    ("the first snowfall of winter", "snow"), ("a lighthouse at night", "light"),
    ("an old bicycle", "wheel"), ("morning coffee", "steam"), ("a city bus at rush hour", "window"),
    ("a cat asleep in the sun", "sun"), ("the sound of rain on a roof", "rain"),
    ("a forgotten garden", "roses"), ("the last day of summer", "summer"), ("a paper boat", "river"),
    ("a kitchen at midnight", "kettle"), ("a grandmother's hands", "hands"), ("a train leaving a station", "platform"),
    ("the moon over the sea", "moon"), ("a library in winter", "pages"), ("a kite on a windy hill", "wind"),
    ("a street market at dusk", "lanterns"), ("fog over a lake", "fog"), ("a child's first drawing", "crayon"),
    ("an empty beach in autumn", "sand"),
]


def poem(i: int, rng: random.Random, table: list = POEMS) -> tuple[str, list[dict]]:
    subject, kw = table[i]
    n = rng.choice([2, 3, 4])
    hi = rng.choice([60, 80, 100])
    text = (f"Write a short poem about {subject} in all lowercase letters, with {n} stanzas separated by "
            f"blank lines. Use the word \"{kw}\" and keep it to at most {hi} words.")
    return text, [{"type": "lowercase"}, {"type": "num_paragraphs", "n": n},
                  {"type": "include_keywords", "keywords": [kw]}, {"type": "word_count", "max": hi}]


# --------------------------------------------------------------------------- 6. exact sentence counts
BENEFITS = [
    ("learning a second language", "brain"), ("riding a bicycle to work", "traffic"),
    ("public libraries", "community"), ("drinking enough water", "energy"),
    ("composting kitchen scraps", "soil"), ("stretching every morning", "muscles"),
    ("keeping a journal", "thoughts"), ("cooking at home", "ingredients"),
    ("taking short walks after meals", "digestion"), ("learning to play an instrument", "patience"),
    ("planting trees in cities", "shade"), ("reading to young children", "vocabulary"),
    ("volunteering in your neighborhood", "neighbors"), ("getting enough sleep", "memory"),
    ("using a budget", "savings"), ("spending time outdoors", "stress"),
    ("learning basic first aid", "emergency"), ("repairing things instead of replacing them", "waste"),
    ("taking regular breaks at work", "focus"), ("visiting museums", "history"),
]


def sentences(i: int, rng: random.Random, table: list = BENEFITS) -> tuple[str, list[dict]]:
    thing, kw = table[i]
    n = rng.choice([3, 4, 5])
    text = f"In exactly {n} sentences, describe the main benefits of {thing}. Mention the word \"{kw}\"."
    constraints = [{"type": "num_sentences", "min": n, "max": n}, {"type": "include_keywords", "keywords": [kw]}]
    if i % 2:
        text += " Do not use any commas."
        constraints.append({"type": "no_commas"})
    else:
        text += " Keep it to at most 90 words."
        constraints.append({"type": "word_count", "max": 90})
    return text, constraints


# --------------------------------------------------------------------------- 7. describe without words
SCENES = [
    ("a busy farmers market", ["fresh", "vegetables"]), ("a thunderstorm at sea", ["rain", "waves"]),
    ("a library at closing time", ["books", "quiet"]), ("a city waking up at dawn", ["sun", "morning"]),
    ("a snowy mountain village", ["snow", "cold"]), ("a crowded train station", ["train", "people"]),
    ("a children's birthday party", ["cake", "balloons"]), ("a quiet forest after rain", ["trees", "green"]),
    ("a night sky far from any city", ["stars", "dark"]), ("a bakery early in the morning", ["bread", "smell"]),
    ("an old harbor", ["boats", "water"]), ("a school playground at recess", ["children", "play"]),
    ("a football stadium on match day", ["crowd", "ball"]), ("a desert at noon", ["sand", "hot"]),
    ("a garden in spring", ["flowers", "bloom"]), ("a hospital waiting room", ["doctor", "nurse"]),
    ("a jazz club late at night", ["music", "saxophone"]), ("a kitchen during a holiday dinner", ["food", "family"]),
    ("a rainy afternoon in a cafe", ["coffee", "rain"]), ("a beach at sunset", ["sun", "ocean"]),
]


def describe(i: int, rng: random.Random, table: list = SCENES) -> tuple[str, list[dict]]:
    scene, banned = table[i]
    wc_text, wc = word_range(rng, [(50, 90), (60, 100), (70, 120)])
    text = f"Describe {scene} without using the words {q(banned).replace(' and ', ' or ')}. {wc_text}"
    constraints = [{"type": "forbidden_words", "words": banned}, wc]
    if i % 2:
        text += " Write it as two paragraphs separated by a blank line."
        constraints.append({"type": "num_paragraphs", "n": 2})
    return text, constraints


# --------------------------------------------------------------------------- 8. keyword frequency
PEP_TALKS = [
    ("a friend training for a first marathon", "step"), ("a student the night before final exams", "you"),
    ("a team finishing a difficult project", "together"), ("a nervous first-time public speaker", "breathe"),
    ("someone starting a new job on Monday", "new"), ("a child learning to ride a bike", "try"),
    ("a coworker recovering from a setback", "forward"), ("a friend moving to a new city", "home"),
    ("a volunteer group cleaning a beach", "together"), ("a musician before a first concert", "music"),
    ("a parent of a newborn who is exhausted", "rest"), ("a gardener whose seeds have not sprouted", "patience"),
    ("a chess player after a lost tournament", "learn"), ("a friend learning to code", "practice"),
    ("a swimmer before a big race", "focus"), ("a writer facing a blank page", "write"),
    ("a small business owner on opening day", "welcome"), ("a hiker halfway up a steep trail", "climb"),
    ("a student retaking a driving test", "calm"), ("a choir before its holiday performance", "sing"),
]


def pep_talk(i: int, rng: random.Random, table: list = PEP_TALKS) -> tuple[str, list[dict]]:
    who, kw = table[i]
    k = rng.choice([3, 4])
    wc_text, wc = word_range(rng, [(40, 70), (50, 90)])
    text = f"Write a short encouraging message for {who}. Use the word \"{kw}\" at least {k} times. {wc_text}"
    constraints = [{"type": "keyword_frequency", "keyword": kw, "min": k}, wc]
    if i % 2 == 0:
        text += ' End with the words "You have got this!"'
        constraints.append({"type": "ends_with", "text": "You have got this!"})
    return text, constraints


# --------------------------------------------------------------------------- 9. two-paragraph answers with a fixed ending
QUESTIONS = [
    "Why do we yawn?", "How do birds know where to migrate?", "What makes a good night's sleep?",
    "Why is the ocean salty?", "How do noise-cancelling headphones work?", "Why do onions make us cry?",
    "How do cats land on their feet?", "Why does ice float?", "How does a compass work?",
    "Why do we get goosebumps?", "How do plants drink water?", "Why is exercise good for mood?",
    "How do glaciers move?", "Why do stars twinkle?", "How does soap clean our hands?",
    "Why do some people get motion sickness?", "How do bats find food in the dark?",
    "Why do we dream?", "How do fireflies glow?", "Why does bread rise in the oven?",
]
ENDINGS = ["That is the short version.", "Thanks for asking!", "Curiosity is always worth it.",
           "Nature is full of clever tricks."]


def answer(i: int, rng: random.Random, table: list = QUESTIONS) -> tuple[str, list[dict]]:
    question = table[i]
    end = ENDINGS[i % len(ENDINGS)]
    wc_text, wc = word_range(rng, [(60, 110), (80, 130), (70, 120)])
    text = (f"Answer the question \"{question}\" in two short paragraphs separated by a blank line. "
            f"{wc_text} Finish with the sentence \"{end}\"")
    return text, [{"type": "num_paragraphs", "n": 2}, wc, {"type": "ends_with", "text": end}]


# --------------------------------------------------------------------------- 10. story openings
STORIES = [
    ("The lighthouse keeper", "storm"), ("On the morning of the flood", "boat"),
    ("Nobody expected the robot", "garden"), ("Every Tuesday, Mrs. Alvarez", "letter"),
    ("The last train of the night", "ticket"), ("When the power went out", "candle"),
    ("My grandfather kept a locked box", "key"), ("The map was wrong", "river"),
    ("At the edge of the village", "wolf"), ("The new girl in class", "violin"),
    ("Under the floorboards", "diary"), ("The bakery opened at dawn", "flour"),
    ("It started with a knock", "stranger"), ("The museum guard yawned", "painting"),
    ("Snow had fallen for six days", "radio"), ("The ship's cat", "island"),
    ("Halfway up the mountain", "tent"), ("The clock in the square stopped", "mayor"),
    ("Rosa found the note", "bench"), ("The first thing I noticed", "silence"),
]


def story(i: int, rng: random.Random, table: list = STORIES) -> tuple[str, list[dict]]:
    start, kw = table[i]
    wc_text, wc = word_range(rng, [(60, 100), (80, 120), (50, 90)])
    text = f"Write the opening paragraph of a story that begins with the words \"{start}\". {wc_text} Include the word \"{kw}\"."
    constraints = [{"type": "start_with", "text": start}, wc, {"type": "include_keywords", "keywords": [kw]}]
    if i % 3 == 2:
        text += " Keep it to a single paragraph."
        constraints.append({"type": "num_paragraphs", "n": 1})
    return text, constraints


# --------------------------------------------------------------------------- 11. numbered how-to steps
HOWTOS = [
    "brewing a pot of loose-leaf tea", "planting a tomato seedling", "changing a bicycle tire",
    "folding a paper airplane", "cleaning a laptop keyboard", "making a simple vinaigrette",
    "hanging a picture frame", "washing a wool sweater by hand", "setting up a new houseplant",
    "backing up photos from a phone", "making overnight oats", "sharpening a kitchen knife",
    "repotting a cactus", "tying a bowline knot", "cleaning a cast-iron pan",
    "wrapping a gift neatly", "making a cup of pour-over coffee", "starting a compost bin",
    "patching a small hole in a wall", "packing a first-aid kit for a hike",
]


def howto(i: int, rng: random.Random, table: list = HOWTOS) -> tuple[str, list[dict]]:
    task = table[i]
    n = rng.choice([4, 5, 6])
    hi = rng.choice([90, 120, 150])
    text = (f"Write step-by-step instructions for {task} as a numbered list of exactly {n} steps "
            f"(\"1.\", \"2.\", ...). Keep it to at most {hi} words.")
    constraints = [{"type": "num_bullets", "n": n}, {"type": "word_count", "max": hi}]
    if i % 2:
        text += " Do not use any commas."
        constraints.append({"type": "no_commas"})
    else:
        text += " Use at most 8 sentences."
        constraints.append({"type": "num_sentences", "max": 8})
    return text, constraints


# --------------------------------------------------------------------------- 12. persuasive notes
PERSUADE = [
    ("your housemates", "switch off lights when they leave a room", "energy"),
    ("your town council", "add more bike lanes", "safety"),
    ("your manager", "try a four-day work week for a month", "productivity"),
    ("your family", "have one screen-free dinner a week", "conversation"),
    ("your neighbors", "start a shared vegetable garden", "garden"),
    ("your classmates", "form a weekly study group", "exam"),
    ("a friend", "join you for a Saturday morning swim", "swim"),
    ("your school", "plant trees along the playground", "shade"),
    ("your book club", "read a classic novel next month", "classic"),
    ("your team", "write shorter meeting notes", "notes"),
    ("your parents", "adopt a dog from a shelter", "shelter"),
    ("your coworkers", "take the stairs instead of the elevator", "stairs"),
    ("your friend", "learn to cook one new dish a week", "dish"),
    ("the library", "stay open later on Fridays", "evening"),
    ("your sports club", "hold a charity run", "charity"),
    ("your apartment building", "set up a book-swap shelf", "books"),
    ("your cousin", "visit the national park with you", "park"),
    ("your office", "switch to reusable coffee cups", "cups"),
    ("your teenage brother", "volunteer at the animal shelter", "animals"),
    ("your city", "keep the public pool open in September", "pool"),
]


def persuade(i: int, rng: random.Random, table: list = PERSUADE) -> tuple[str, list[dict]]:
    audience, action, kw = table[i]
    wc_text, wc = word_range(rng, [(60, 100), (70, 120)])
    text = (f"Write a two-paragraph note persuading {audience} to {action}. Separate the paragraphs "
            f"with a blank line, mention the word \"{kw}\" and do not use any commas. {wc_text}")
    return text, [{"type": "num_paragraphs", "n": 2}, {"type": "include_keywords", "keywords": [kw]},
                  {"type": "no_commas"}, wc]


KINDS = [explain, tips, email, product, poem, sentences, describe, pep_talk, answer, story, howto, persuade]


# --------------------------------------------------------------------------- the held-out extension
# New subjects for the same twelve kinds, written after prompts.jsonl was fixed; they are in no
# train/val/held-out split. `tea prepare-data builtin` appends them to the held-out prompts as the
# heldout_ext split (docs/data.md), so a study can evaluate on more than 48 prompts while the
# quickstart's splits stay byte for byte as they were.
EXTENSION = {
    explain: [
        ("how a microwave oven heats food", ["water", "waves"]),
        ("why the moon has phases", ["sunlight", "orbit"]),
        ("how paper is recycled", ["pulp", "fiber"]),
        ("what causes wind", ["pressure", "air"]),
        ("how a battery stores energy", ["chemical", "charge"]),
        ("why volcanoes erupt", ["magma", "pressure"]),
        ("how the internet delivers a message", ["packet", "router"]),
        ("why we need sleep", ["brain", "rest"]),
    ],
    tips: [
        ("keeping a bicycle in good shape", "chain"),
        ("organizing a cluttered closet", "hangers"),
        ("making friends after moving to a new city", "club"),
        ("drinking more water during the day", "bottle"),
        ("writing a thank-you note", "specific"),
        ("preparing a garden for winter", "mulch"),
        ("staying calm in heavy traffic", "music"),
        ("keeping track of personal expenses", "receipts"),
    ],
    email: [
        ("your neighbor Omar", "Omar", "asking him to water your plants while you travel", ["plants", "travel"]),
        ("your team lead Sofia", "Sofia", "requesting a day off next Monday", ["Monday", "coverage"]),
        ("your friend Chen", "Chen", "returning the camera you borrowed", ["camera", "thanks"]),
        ("a plumber named Luis", "Luis", "asking for a quote to fix a shower", ["shower", "quote"]),
        ("your aunt Helen", "Helen", "thanking her for a birthday gift", ["gift", "scarf"]),
        ("a gym manager named Dana", "Dana", "cancelling your membership", ["membership", "cancel"]),
        ("your classmate Ben", "Ben", "sharing notes from a lecture he missed", ["notes", "lecture"]),
        ("a museum guide named Iris", "Iris", "booking a tour for a group of ten", ["tour", "group"]),
    ],
    product: [
        ("a rechargeable bike light", ["light", "battery"]),
        ("a set of glass food containers", ["glass", "lid"]),
        ("a hand-knitted wool hat", ["wool", "winter"]),
        ("a stainless steel French press", ["coffee", "filter"]),
        ("a yoga mat with extra grip", ["grip", "cushion"]),
        ("a pack of beeswax food wraps", ["beeswax", "fresh"]),
        ("a foldable laptop stand", ["laptop", "height"]),
        ("a children's rain jacket", ["rain", "hood"]),
    ],
    poem: [
        ("a candle in a dark room", "flame"), ("an orchard in autumn", "apples"), ("a harbor at dawn", "gulls"),
        ("a quiet snowy road", "tracks"), ("a summer thunderstorm", "thunder"), ("an old clock", "ticking"),
        ("a field of sunflowers", "gold"), ("a night bus ride", "lights"),
    ],
    sentences: [
        ("learning to swim", "safety"), ("eating breakfast", "morning"), ("writing letters by hand", "personal"),
        ("walking a dog every day", "exercise"), ("growing your own vegetables", "harvest"),
        ("learning to touch type", "speed"), ("keeping a tidy workspace", "clutter"), ("talking with your neighbors", "trust"),
    ],
    describe: [
        ("a busy airport terminal", ["plane", "luggage"]), ("a campfire in the woods", ["fire", "smoke"]),
        ("a school science fair", ["project", "students"]), ("a fishing village at dawn", ["fish", "nets"]),
        ("a public swimming pool in summer", ["water", "swim"]), ("a painter's studio", ["paint", "canvas"]),
        ("a mountain lake at noon", ["lake", "mountain"]), ("a train crossing a bridge", ["train", "bridge"]),
    ],
    pep_talk: [
        ("a friend learning to play the guitar", "chord"), ("a teammate before a penalty kick", "breathe"),
        ("a student starting university", "curious"), ("a friend running a first bake sale", "proud"),
        ("a colleague presenting to the board", "ready"), ("a neighbor training for a charity swim", "stroke"),
        ("a sibling learning to drive", "steady"), ("a friend opening a small bookshop", "books"),
    ],
    answer: [
        "Why do cats purr?", "How do submarines dive and surface?", "Why does popcorn pop?",
        "How do spiders spin their webs?", "Why do our ears pop on airplanes?", "How does a thermometer work?",
        "Why do trees lose their leaves in autumn?", "How do owls see at night?",
    ],
    story: [
        ("The letter arrived forty years late", "stamp"), ("Nobody had opened the attic door", "dust"),
        ("The bus driver took a wrong turn", "forest"), ("On the first day of spring", "kite"),
        ("The old radio crackled", "voice"), ("My sister found a strange coin", "market"),
        ("The elevator stopped between floors", "button"), ("The dog would not stop barking", "fence"),
    ],
    howto: [
        "boiling an egg", "cleaning a pair of running shoes", "folding a paper crane", "planting herbs in pots",
        "ironing a dress shirt", "pitching a tent", "making a simple fruit smoothie", "defrosting a freezer",
    ],
    persuade: [
        ("your roommates", "keep a shared grocery list", "groceries"),
        ("your manager", "allow standing desks in the office", "health"),
        ("your family", "take a hiking trip instead of a beach holiday", "trail"),
        ("your neighbors", "organize a street cleanup day", "street"),
        ("your school", "add a cooking class", "cooking"),
        ("your friend", "try a board game night", "games"),
        ("your town", "install drinking fountains in its parks", "fountains"),
        ("your club", "pair each new member with a mentor", "mentor"),
    ],
}


# --------------------------------------------------------------------------- the hard set (builtin-hard)
# The same twelve kinds and 28 subjects each (the 20 of prompts.jsonl and the 8 of heldout_ext.jsonl), each
# prompt with three more constraints drawn from EXTRAS (5-7 in all), under their own RNG: a set on which the
# untrained SmolLM2-135M's best-of-256 stays far from the ceiling (results/hard_reward.md). Its texts
# differ from every prompt of the other two files, so its ids do too; `tea prepare-data builtin-hard`
# splits it 176 / 32 / 128.
ENDS = ["That is all.", "Now you know.", "Thanks for reading.", "Have a good day."]
FORBIDDEN = [["and"], ["very", "really", "just"], ["is", "are"], ["you", "your"], ["thing", "things", "good"]]
EXTRA_ORDER = ["lowercase", "no_commas", "keyword_frequency", "forbidden_words", "ends_with", "num_sentences"]
NO_SENTENCE_COUNT = {"tips", "poem", "howto", "answer", "persuade", "sentences"}  # lists, stanzas, paragraphs, or already counted


def _fixed_texts(constraints: list[dict]) -> list[str]:
    """Every text the response must contain: starts, ends and keywords (a forbidden word may be none of them)."""
    out = [c["text"] for c in constraints if c["type"] in ("start_with", "ends_with")]
    out += [k for c in constraints if c["type"] == "include_keywords" for k in c["keywords"]]
    return out + [c["keyword"] for c in constraints if c["type"] == "keyword_frequency"]


def _mentions(text: str, words: list[str]) -> bool:
    """Whether `text` holds one of `words` as the rule reward's forbidden_words counts them (`count_keyword`)."""
    return any(count_keyword(text, w) for w in words)


def _extra(name: str, kind: str, rng: random.Random, constraints: list[dict]) -> tuple[str, dict] | None:
    """The instruction and the constraint of one extra, or None where it would repeat or contradict one."""
    types = {c["type"] for c in constraints}
    fixed = _fixed_texts(constraints)
    if name == "lowercase" and "lowercase" not in types:
        return "Write the whole answer in lowercase letters.", {"type": "lowercase"}
    if name == "no_commas" and "no_commas" not in types and not any("," in t for t in fixed):
        return "Do not use any commas.", {"type": "no_commas"}
    if name == "keyword_frequency" and "keyword_frequency" not in types:
        keywords = [k for c in constraints if c["type"] == "include_keywords" for k in c["keywords"]]
        if keywords:
            k = rng.choice([3, 4])
            return f"Use the word \"{keywords[0]}\" at least {k} times.", {"type": "keyword_frequency", "keyword": keywords[0], "min": k}
    if name == "forbidden_words" and "forbidden_words" not in types:
        options = [ws for ws in FORBIDDEN if not any(_mentions(t, ws) for t in fixed)]
        ws = rng.choice(options)
        return f"Do not use the words {q(ws).replace(' and ', ' or ')}." if len(ws) > 1 else f"Do not use the word \"{ws[0]}\".", \
            {"type": "forbidden_words", "words": ws}
    if name == "ends_with" and "ends_with" not in types:
        forbidden = [w for c in constraints if c["type"] == "forbidden_words" for w in c["words"]]
        end = rng.choice([e for e in ENDS if not _mentions(e, forbidden)])
        return f"End with the sentence \"{end}\"", {"type": "ends_with", "text": end}
    if name == "num_sentences" and "num_sentences" not in types and kind not in NO_SENTENCE_COUNT:
        n = rng.choice([4, 5, 6])
        return f"Write exactly {n} sentences.", {"type": "num_sentences", "min": n, "max": n}
    return None


def hard(kind, i: int, rng: random.Random, table: list, extras: int = 3) -> tuple[str, list[dict]]:
    """A prompt of `kind` on table[i] with `extras` more constraints where the kind allows (at least three), stated after the kind's own."""
    text, constraints = kind(i, rng, table)
    names = rng.sample(EXTRA_ORDER, len(EXTRA_ORDER))
    added = 0
    for name in names:
        got = _extra(name, kind.__name__, rng, constraints)
        if got is None:
            continue
        text += " " + got[0]
        constraints.append(got[1])
        added += 1
        if added == extras:
            break
    assert added >= 3, (kind.__name__, i)
    return text, constraints


def _record(kind, i: int, rng: random.Random, table: list, seen: set[str], extras: int = 0) -> str:
    text, constraints = hard(kind, i, rng, table, extras) if extras else kind(i, rng, table)
    messages = normalize_messages([{"role": "user", "content": text}])
    pid = prompt_id(messages)
    assert pid not in seen, text
    seen.add(pid)
    validate_constraints(constraints, pid)
    record = {"id": pid, "messages": messages, "source": "builtin", "constraints": constraints}
    return json.dumps(record, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _build(seen: set[str]) -> list[str]:
    rng = random.Random(20250101)
    return [_record(kind, i, rng, kind.__defaults__[0], seen) for i in range(20) for kind in KINDS]


def _build_heldout_ext(seen: set[str]) -> list[str]:
    rng = random.Random(20250102)  # its own stream: the numbers of prompts.jsonl are untouched
    return [_record(kind, i, rng, EXTENSION[kind], seen) for i in range(8) for kind in KINDS]


def _jsonl(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode("utf-8")


def build() -> bytes:
    """prompts.jsonl: the 240 prompts that prepare-data splits into train / val / heldout."""
    return _jsonl(_build(set()))


def build_heldout_ext() -> bytes:
    """heldout_ext.jsonl: 96 further prompts, none equal to a prompt of prompts.jsonl."""
    seen: set[str] = set()
    _build(seen)
    return _jsonl(_build_heldout_ext(seen))


def build_hard(extras: int = 3) -> bytes:
    """hard.jsonl: 336 prompts (12 kinds x 28 subjects) with 5-7 constraints each, none equal to a prompt of the other files."""
    seen: set[str] = set()
    _build(seen)
    _build_heldout_ext(seen)
    rng = random.Random(20261128)  # its own stream again
    tables = {kind: kind.__defaults__[0] + EXTENSION[kind] for kind in KINDS}
    return _jsonl([_record(kind, i, rng, tables[kind], seen, extras) for i in range(28) for kind in KINDS])


def main() -> int:
    stale = False
    for out, data in ((OUT, build()), (OUT_EXT, build_heldout_ext()), (OUT_HARD, build_hard())):
        if "--check" in sys.argv:
            stale_here = not out.is_file() or out.read_bytes() != data
            print(f"{out.name}: {'stale' if stale_here else 'up to date'}")
            stale = stale or stale_here
        else:
            out.write_bytes(data)
            print(f"wrote {len(data.splitlines())} prompts to {out}")
    return int(stale)


if __name__ == "__main__":
    raise SystemExit(main())
