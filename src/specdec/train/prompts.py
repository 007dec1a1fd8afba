"""Synthetic instructions for distilling a draft head: varied tasks, none taken from Spec-Bench.

The head must learn the target's own answers to the kinds of requests people make (writing, QA,
coding, math, summarising or translating a given text, roleplay, extraction...). Spec-Bench is the
test set, so the prompts here are built from our own templates and word lists, shuffled by a seed.
"""

from __future__ import annotations

import random

TOPICS = [
    "the water cycle", "black holes", "the French Revolution", "photosynthesis", "machine learning",
    "climate change", "the Roman Empire", "volcanoes", "the human heart", "electric cars", "honey bees",
    "the stock market", "renewable energy", "the printing press", "vaccines", "the Moon landing",
    "coffee", "chess", "the Internet", "ancient Egypt", "plate tectonics", "jazz music", "the immune system",
    "recycling", "the Great Wall of China", "quantum computers", "dinosaurs", "the Olympic Games",
    "social media", "sleep", "rainforests", "inflation", "the solar system", "DNA", "bicycles",
    "the Renaissance", "earthquakes", "artificial intelligence", "ocean tides", "World War II",
    "healthy eating", "meditation", "the printing of money", "airplanes", "microplastics", "Shakespeare",
    "the periodic table", "cloud computing", "bread baking", "gardening", "public libraries", "remote work",
    "space telescopes", "the Silk Road", "electricity", "friendship", "time management", "video games",
]
PEOPLE = ["a pirate captain", "a medieval knight", "a friendly robot", "a detective", "a chef",
          "a tour guide in Rome", "a wise old wizard", "a startup founder", "a kindergarten teacher",
          "an astronaut on Mars", "a sports coach", "a museum curator", "a travel agent", "a doctor"]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese"]
SENTENCES = [
    "The weather is beautiful today, so we are going to the park.", "I would like a cup of tea, please.",
    "Where is the nearest train station?", "My brother is learning to play the guitar.",
    "The meeting has been moved to Thursday afternoon.", "Reading books is my favourite hobby.",
    "We need to buy bread, milk and eggs.", "The museum opens at nine in the morning.",
    "She has lived in this city for ten years.", "Can you help me carry these boxes?",
    "The children are playing in the garden.", "This restaurant serves the best pizza in town.",
]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "finds the largest element in a list", "counts the vowels in a sentence", "merges two sorted lists",
    "removes duplicates from a list", "computes the n-th Fibonacci number", "checks if a word is a palindrome",
    "sorts a list of dictionaries by a key", "reads a CSV file and prints each row", "converts Celsius to Fahrenheit",
    "implements binary search", "counts word frequencies in a text", "flattens a nested list",
]
LANGS_CODE = ["Python", "JavaScript", "C", "Java", "Rust", "Go"]
NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas"]
ITEMS = ["apples", "books", "pencils", "marbles", "cookies", "stickers", "oranges", "cards"]

WRITING = [
    "Write a short story about {topic}.", "Write a poem about {topic}.", "Write a blog post about {topic}.",
    "Write a persuasive essay arguing that everyone should learn about {topic}.",
    "Draft a friendly email inviting a colleague to a talk about {topic}.",
    "Write a product description for a board game about {topic}.", "Write a haiku about {topic}.",
    "Write a speech for a school assembly about {topic}.", "Describe {topic} to a five-year-old.",
]
QA = [
    "What is {topic}?", "Explain {topic} in simple terms.", "Why is {topic} important?",
    "What are three interesting facts about {topic}?", "How does {topic} work?",
    "What are the pros and cons of {topic}?", "Give me a short history of {topic}.",
    "What are common misconceptions about {topic}?", "List five questions a student might ask about {topic}.",
    "Compare {topic} and {other}.", "How are {topic} and {other} related?",
]
ROLEPLAY = [
    "Pretend you are {person}. Introduce yourself and talk about {topic}.",
    "You are {person}. Give me advice about {topic}.",
    "Act as {person} and describe a typical day at work.",
]
REASONING = [
    "Give step-by-step advice for someone who wants to learn about {topic}.",
    "Plan a one-week study schedule to learn about {topic}.",
    "What would happen if {topic} suddenly disappeared? Think it through.",
    "Extract the key terms a beginner must know about {topic} and define each one.",
]


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 9)
    name, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    forms = [
        f"{name} has {a} {item}. {other} gives {name} {b} more, then {name} shares them equally among {c} friends. "
        f"How many {item} does each friend get, and how many are left? Solve step by step.",
        f"A shop sells {item} at {c} dollars each. {name} buys {a} of them and pays with a {100 * c} dollar note. "
        "How much change does she get? Explain your reasoning.",
        f"What is {a} times {b} plus {c}? Show your work.",
        f"Solve for x: {c}x + {a} = {a + c * b}.",
        f"A train travels {a * 10} km in {c} hours. What is its average speed? Then how far does it go in {b} hours?",
        f"The sum of two numbers is {a + b} and their difference is {abs(a - b)}. Find the numbers.",
    ]
    return rng.choice(forms)


def _summary(rng: random.Random) -> str:
    topic, other = rng.sample(TOPICS, 2)
    facts = [
        f"Researchers have studied {topic} for many decades.",
        f"Many people first hear about {topic} at school, but few understand it in depth.",
        f"Recent work links {topic} to {other} in surprising ways.",
        f"Experts say that public interest in {topic} grew quickly over the last ten years.",
        f"Critics argue that the importance of {topic} is often exaggerated.",
        f"A new report recommends more funding for teaching {topic}.",
        f"Local groups now organise monthly meetings about {topic} and {other}.",
    ]
    rng.shuffle(facts)
    text = " ".join(facts[: rng.randint(4, 7)])
    ask = rng.choice(["Summarize the following text in two sentences:", "Summarize this article:",
                      "Give a one-paragraph summary of the text below.", "What is the main point of this passage?"])
    return f"{ask}\n\n{text}"


def _translate(rng: random.Random) -> str:
    lang, sentence = rng.choice(LANGUAGES), rng.choice(SENTENCES)
    form = rng.choice(["Translate into {lang}: {s}", "Translate the following sentence from English to {lang}.\n{s}",
                       "How do you say \"{s}\" in {lang}?"])
    return form.format(lang=lang, s=sentence)


def _code(rng: random.Random) -> str:
    task, lang = rng.choice(CODE_TASKS), rng.choice(LANGS_CODE)
    form = rng.choice(["Write a {lang} function that {task}.", "Show me {lang} code that {task}, and explain it.",
                       "How do I write a program in {lang} that {task}?"])
    return form.format(lang=lang, task=task)


def _templated(rng: random.Random, templates: list[str]) -> str:
    topic, other = rng.sample(TOPICS, 2)
    return rng.choice(templates).format(topic=topic, other=other, person=rng.choice(PEOPLE))


def make_prompts(n: int, seed: int = 0) -> list[str]:
    """n varied instructions (deterministic for a seed), mixing every kind of task in fixed shares."""
    rng = random.Random(seed)
    kinds = [(lambda r: _templated(r, WRITING), 3), (lambda r: _templated(r, QA), 4),
             (lambda r: _templated(r, ROLEPLAY), 1), (lambda r: _templated(r, REASONING), 2),
             (_math, 2), (_summary, 2), (_translate, 1), (_code, 2)]
    pool = [make for make, weight in kinds for _ in range(weight)]
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        prompt = rng.choice(pool)(rng)
        if prompt not in seen or len(seen) > 50 * n:
            seen.add(prompt)
            out.append(prompt)
    return out
