"""Synthetic instructions for distilling a draft head: varied tasks, none taken from Spec-Bench.

The head must learn the target's own answers to the kinds of requests people make (writing, QA,
advice, coding, math, summarising or translating a given text, roleplay, extraction, answering from
given passages...). Spec-Bench is the test set, so the prompts here are built from our own templates
and word lists (about 430 topics), shuffled by a seed, or written by the target itself (the
self-instruct stages at the end of this file).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

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
    "the Industrial Revolution", "antibiotics", "the Amazon river", "glaciers", "wind turbines", "solar panels",
    "the Cold War", "the Byzantine Empire", "the Maya civilisation", "ancient Greece", "democracy",
    "supply and demand", "cryptocurrency", "interest rates", "the human brain", "nutrition for athletes",
    "mental health", "urban planning", "public transport", "smartphones", "3D printing", "robotics",
    "self-driving cars", "nuclear energy", "the theory of evolution", "the Big Bang", "gravity", "magnets",
    "rainbows", "lightning", "hurricanes", "coral reefs", "deserts", "the Arctic", "penguins", "elephants",
    "wolves", "octopuses", "migrating birds", "mushrooms", "the history of writing", "opera", "hip hop",
    "classical music", "film making", "photography", "modern art", "architecture", "poetry", "theatre",
    "the novel", "philosophy", "ethics", "the scientific method", "statistics", "probability", "algebra",
    "geometry", "prime numbers", "cryptography", "computer viruses", "databases", "operating systems",
    "open source software", "web design", "cybersecurity", "email etiquette", "job interviews",
    "personal finance", "saving for retirement", "starting a small business", "marketing", "negotiation",
    "leadership", "teamwork", "public speaking", "learning a language", "studying for exams", "homeschooling",
    "parenting", "pets", "dog training", "houseplants", "cooking pasta", "vegetarian diets", "tea",
    "chocolate", "wine making", "cheese", "spices", "the history of medicine", "surgery", "the common cold",
    "exercise", "running a marathon", "yoga", "football", "basketball", "tennis", "mountain climbing",
    "camping", "sailing", "travel in Japan", "travel in Italy", "the Alps", "the Sahara", "volunteering",
    "human rights", "the United Nations", "elections", "taxes", "globalisation", "immigration", "cities",
    "farming", "fishing", "water pollution", "air quality", "forests", "biodiversity", "bees and pollination",
    "the ozone layer", "satellites", "Mars exploration", "the International Space Station", "comets",
    "the speed of light", "atoms", "chemical reactions", "batteries", "semiconductors", "lasers", "sound waves",
    "the history of the bicycle", "trains", "ships", "bridges", "skyscrapers", "castles", "museums",
    "fairy tales", "mythology", "the Vikings", "the Aztecs", "the Ottoman Empire", "the Mongol Empire",
    "the American Revolution", "the history of jazz", "board games", "magic tricks", "happiness", "habits",
    "creativity", "curiosity", "boredom", "memory", "dreams", "languages of the world", "emoji",
    # science and mathematics
    "Newton's laws of motion", "entropy", "the greenhouse effect", "cell division", "enzymes", "the nitrogen cycle",
    "acids and bases", "the Pythagorean theorem", "calculus", "vectors", "logarithms", "infinity",
    "the theory of relativity", "quantum entanglement", "dark matter", "neutron stars", "the Doppler effect",
    "friction", "buoyancy", "thermodynamics", "electromagnetic waves", "radioactivity", "the speed of sound",
    "stem cells", "genetic engineering", "the microbiome", "viruses and bacteria", "blood pressure",
    "the nervous system", "hormones", "allergies", "diabetes", "vitamins", "the placebo effect",
    "neural networks", "large language models", "recursion", "hash tables", "sorting algorithms",
    "regular expressions", "version control with Git", "APIs", "unit testing", "Docker containers",
    "SQL joins", "the binary number system", "compilers", "computer memory", "encryption keys",
    "machine translation", "game theory", "the normal distribution", "compound interest", "fractions",
    "percentages", "the metric system", "weather forecasting", "ocean currents", "soil erosion",
    "photosynthesis in algae", "food chains", "extinction", "invasive species", "carbon capture",
    "hydrogen fuel", "geothermal energy", "the water supply of a city", "desalination", "nanotechnology",
    # history, society and the humanities
    "the Enlightenment", "the Reformation", "the Treaty of Versailles", "the fall of the Berlin Wall",
    "the civil rights movement", "the Harlem Renaissance", "impressionism", "existentialism", "stoicism",
    "utilitarianism", "Confucius", "Socrates", "the Meiji Restoration", "colonialism", "the Han dynasty",
    "the Inca Empire", "the Black Death", "the Crusades", "the Magna Carta", "the French language",
    "the Cuban Missile Crisis", "the space race", "the history of the Internet", "the Great Depression",
    "the suffragette movement", "ancient Mesopotamia", "the Phoenicians", "the Ming dynasty",
    "the abolition of slavery", "the European Union", "the Hundred Years' War", "feudalism",
    "propaganda", "free speech", "the separation of powers", "the welfare state", "universal basic income",
    "minimum wage laws", "trade unions", "behavioural economics", "cognitive biases", "child development",
    "the psychology of motivation", "introverts and extroverts", "grief", "loneliness", "peer pressure",
    "gender equality", "the ethics of eating meat", "animal testing", "privacy online", "misinformation",
    "censorship", "the role of museums", "folk music", "Greek tragedy", "the sonnet", "science fiction",
    "graphic novels", "the Harry Potter books", "Renaissance painting", "Baroque music", "street art",
    "dance", "calligraphy", "the history of fashion", "world religions", "festivals around the world",
    # everyday life, work and money
    "buying a used car", "moving to a new city", "writing a CV", "budgeting for groceries", "first aid",
    "home insurance", "composting", "reducing food waste", "renting an apartment", "credit scores",
    "student loans", "online shopping", "saving energy at home", "planning a wedding", "raising teenagers",
    "caring for elderly parents", "working night shifts", "commuting by bike", "learning to drive",
    "cooking on a budget", "baking a cake", "making coffee at home", "packing for a trip", "jet lag",
    "travelling on a budget", "visiting national parks", "learning to swim", "a healthy morning routine",
    "screen time for children", "online privacy for teenagers", "hiring the first employee",
    "customer service", "project management", "remote meetings", "writing a business plan",
    "pricing a product", "supply chains", "small talk", "conflict at work", "asking for a raise",
    "procrastination", "burnout", "note taking", "speed reading", "keeping a journal", "minimalism",
    "decluttering a home", "adopting a cat", "keeping chickens", "growing tomatoes", "birdwatching",
    "knitting", "woodworking", "playing the piano", "learning to draw", "podcasts", "e-books",
    # places
    "Tokyo", "Paris", "New York City", "Mexico City", "Cairo", "Mumbai", "Sydney", "Rio de Janeiro",
    "Iceland", "Kenya", "Canada", "Peru", "Vietnam", "Norway", "Morocco", "New Zealand", "the Himalayas",
    "the Mediterranean Sea", "the Nile", "the Great Barrier Reef", "Antarctica", "the Grand Canyon",
]
PEOPLE = ["a pirate captain", "a medieval knight", "a friendly robot", "a detective", "a chef",
          "a tour guide in Rome", "a wise old wizard", "a startup founder", "a kindergarten teacher",
          "an astronaut on Mars", "a sports coach", "a museum curator", "a travel agent", "a doctor",
          "a grumpy librarian", "a famous novelist", "a park ranger", "a time traveller from 1850",
          "a job interviewer", "a personal trainer", "a customer support agent", "a history professor",
          "a news reporter", "a farmer", "a lighthouse keeper", "a dragon", "a cat who can talk",
          "Sherlock Holmes", "a ship's navigator", "a marine biologist", "a stand-up comedian", "a therapist",
          "a financial advisor", "a nurse", "a software engineer", "a Roman senator", "a Viking explorer",
          "a retired football player", "a bakery owner", "a nervous first-time traveller", "a poet",
          "a real estate agent", "a high school principal", "a mountain guide", "an AI assistant from the future"]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]
SENTENCES = [
    "The weather is beautiful today, so we are going to the park.", "I would like a cup of tea, please.",
    "Where is the nearest train station?", "My brother is learning to play the guitar.",
    "The meeting has been moved to Thursday afternoon.", "Reading books is my favourite hobby.",
    "We need to buy bread, milk and eggs.", "The museum opens at nine in the morning.",
    "She has lived in this city for ten years.", "Can you help me carry these boxes?",
    "The children are playing in the garden.", "This restaurant serves the best pizza in town.",
    "The government announced new rules for public transport yesterday.",
    "Our team finished the project two weeks ahead of schedule.", "I forgot my umbrella at the office.",
    "The concert was cancelled because of the storm.", "Please send me the report by Friday.",
    "He has never seen the sea before.", "The price of fuel rose sharply last month.",
]
FOREIGN = [  # (language, sentence) to translate into English
    ("German", "Die Regierung hat gestern ein neues Gesetz zum Klimaschutz beschlossen."),
    ("German", "Ich habe meinen Schlüssel im Zug vergessen und musste lange warten."),
    ("German", "Das Museum ist montags geschlossen, aber am Wochenende sehr voll."),
    ("German", "Viele Studenten arbeiten neben dem Studium, um ihre Miete zu bezahlen."),
    ("German", "Der Bürgermeister eröffnete am Samstag die neue Brücke über den Fluss."),
    ("German", "Wegen des starken Regens fielen mehrere Spiele der Liga aus."),
    ("German", "Die Firma plant, im nächsten Jahr zweihundert neue Mitarbeiter einzustellen."),
    ("German", "Meine Großmutter backt jeden Sonntag einen Apfelkuchen für die ganze Familie."),
    ("German", "Die Preise für Lebensmittel sind in den letzten Monaten deutlich gestiegen."),
    ("German", "Forscher haben eine neue Art von Frosch im Regenwald entdeckt."),
    ("German", "Der Zug nach Berlin hat heute eine Verspätung von dreißig Minuten."),
    ("German", "Kannst du mir bitte erklären, wie dieses Programm funktioniert?"),
    ("French", "Le gouvernement a présenté hier un nouveau plan pour les transports publics."),
    ("French", "Nous avons passé nos vacances au bord de la mer en Bretagne."),
    ("French", "La bibliothèque municipale sera fermée pendant les travaux de rénovation."),
    ("French", "Les chercheurs ont publié une étude sur les effets du sommeil sur la mémoire."),
    ("French", "Mon voisin joue du piano tous les soirs après le dîner."),
    ("Spanish", "El equipo local ganó el partido en el último minuto."),
    ("Spanish", "Mañana vamos a visitar a mis abuelos en el campo."),
    ("Spanish", "La empresa anunció que abrirá una nueva fábrica el próximo año."),
    ("Spanish", "Los científicos creen que el hielo del Ártico desaparece cada vez más rápido."),
    ("Italian", "Il treno per Milano parte alle otto e mezza dal binario tre."),
    ("Italian", "Ogni estate la città organizza un festival di musica all'aperto."),
]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "finds the largest element in a list", "counts the vowels in a sentence", "merges two sorted lists",
    "removes duplicates from a list", "computes the n-th Fibonacci number", "checks if a word is a palindrome",
    "sorts a list of dictionaries by a key", "reads a CSV file and prints each row", "converts Celsius to Fahrenheit",
    "implements binary search", "counts word frequencies in a text", "flattens a nested list",
    "finds the longest common prefix of a list of strings", "validates an email address",
    "computes the greatest common divisor of two numbers", "transposes a matrix", "implements a stack class",
    "implements a queue with two stacks", "parses a date string and prints the weekday",
    "finds all anagrams of a word in a list", "computes the median of a list", "implements bubble sort",
    "implements merge sort", "checks whether parentheses are balanced", "converts a number to Roman numerals",
    "downloads a web page and counts its links", "finds the shortest path in a grid with BFS",
    "implements a simple linked list", "rotates an array by k positions", "computes the sum of digits of a number",
    "counts the lines, words and characters of a file", "generates all permutations of a string",
    "checks whether two strings are anagrams", "finds the second largest number in a list",
    "implements a least-recently-used cache", "converts a binary string to a decimal number",
    "computes the dot product of two vectors", "groups a list of words by their first letter",
    "returns the k most frequent elements of a list", "implements a binary search tree with insert and search",
    "checks whether a year is a leap year", "calculates compound interest", "simulates rolling two dice 1000 times",
    "finds the missing number in a list from 1 to n", "splits a sentence into words and capitalises each one",
    "detects a cycle in a linked list", "computes the edit distance between two strings",
]
LANGS_CODE = ["Python", "JavaScript", "C", "C++", "Java", "Rust", "Go", "TypeScript", "SQL", "Bash"]
SNIPPETS = [
    "def add(a, b):\n    return a - b",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)",
    "def mean(xs):\n    return sum(xs) / len(xs)",
    "function greet(name) {\n  return 'Hello, ' + name;\n}",
    "def find(xs, x):\n    for i in range(len(xs)):\n        if xs[i] == x:\n            return i\n    return -1",
    "int max(int a, int b) { return a > b ? a : b; }",
    "SELECT name, COUNT(*) FROM orders GROUP BY name ORDER BY COUNT(*) DESC;",
    "numbers = [3, 1, 2]\nnumbers.sort()\nprint(numbers[-1])",
    "def is_even(n):\n    return n % 2 == 1",
    "const squares = [1, 2, 3].map(x => x * x);",
    "def fact(n):\n    if n == 0:\n        return 1\n    return n * fact(n - 1)",
    "total = 0\nfor x in [4, 8, 15]:\n    total += x\nprint(total / 3)",
    "def last(xs):\n    return xs[len(xs)]",
    "with open('data.txt') as f:\n    lines = [line.strip() for line in f if line.strip()]",
    "let count = 0;\nfor (let i = 0; i <= 10; i++) {\n  count += i;\n}\nconsole.log(count);",
    "SELECT * FROM users WHERE age > 30 AND city = 'Paris';",
    "def unique(xs):\n    return list(set(xs))",
    "words = text.split()\ncounts = {}\nfor w in words:\n    counts[w] = counts.get(w, 0) + 1",
    "for (int i = 0; i < n; i++)\n    for (int j = 0; j < n; j++)\n        c[i][j] = a[i][j] + b[i][j];",
    "def divide(a, b):\n    return a / b\n\nprint(divide(3, 0))",
]
NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kofi", "Lena",
         "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Victor", "Wen", "Yusuf"]
ITEMS = ["apples", "books", "pencils", "marbles", "cookies", "stickers", "oranges", "cards", "eggs", "tickets",
         "flowers", "coins", "cupcakes", "bottles of water", "notebooks", "toy cars"]
CITIES = ["Lisbon", "Nairobi", "Toronto", "Osaka", "Melbourne", "Lyon", "Krakow", "Austin", "Seville", "Bergen",
          "Valparaiso", "Hanoi", "Edinburgh", "Porto", "Denver", "Tallinn"]
COMPANIES = ["Northwind Labs", "Bluepeak Foods", "Orbital Parts", "Greenleaf Energy", "Harbor Books",
             "Quantix Software", "Riverstone Bank", "Sunrise Clinics", "Atlas Freight", "Maple Games"]

WRITING = [
    "Write a short story about {topic}.", "Write a poem about {topic}.", "Write a blog post about {topic}.",
    "Write a persuasive essay arguing that everyone should learn about {topic}.",
    "Draft a friendly email inviting a colleague to a talk about {topic}.",
    "Write a product description for a board game about {topic}.", "Write a haiku about {topic}.",
    "Write a speech for a school assembly about {topic}.", "Describe {topic} to a five-year-old.",
    "Write a limerick about {topic}.", "Write a diary entry of {person} who discovers {topic}.",
    "Write a dialogue between {person} and a student about {topic}.",
    "Write a news article announcing a breakthrough in {topic}.",
    "Compose a formal letter to the mayor asking for more support for {topic}.",
    "Write a travel blog post that mentions {topic}.", "Write a short mystery story involving {topic}.",
    "Write a catchy slogan and a short advert for a course on {topic}.",
    "Write a three-paragraph essay on {topic} with a title.", "Write a song chorus about {topic}.",
    "Write a children's bedtime story about {topic} and {other}.",
    "Write a review of an imaginary documentary about {topic}.",
    "Write a motivational message for someone who is struggling to understand {topic}.",
    "Write a short opinion piece about {topic} for a local newspaper.", "Write a tweet about {topic}.",
    "Write a cover letter for a job that involves {topic}.",
    "Write a thank-you note to a teacher who taught me about {topic}.",
    "Write an outline for a presentation on {topic}.", "Write the opening paragraph of a novel that involves {topic}.",
    "Write a two-paragraph introduction to {topic} for a textbook.", "Write a short scene for a play about {topic}.",
    "Write a FAQ page with five questions and answers about {topic}.", "Write a recipe-style guide to {topic}.",
    "Write a letter from {person} to a friend, explaining {topic}.", "Write a rap verse about {topic}.",
    "Write a social media post announcing a workshop on {topic} and {other}.",
    "Write a short, funny story in which {person} gets confused about {topic}.",
]
QA = [
    "What is {topic}?", "Explain {topic} in simple terms.", "Why is {topic} important?",
    "What are three interesting facts about {topic}?", "How does {topic} work?",
    "What are the pros and cons of {topic}?", "Give me a short history of {topic}.",
    "What are common misconceptions about {topic}?", "List five questions a student might ask about {topic}.",
    "Compare {topic} and {other}.", "How are {topic} and {other} related?",
    "Can you explain {topic} like I'm a beginner?", "What should everyone know about {topic}?",
    "Tell me about {topic}.", "What is the future of {topic}?", "Who are the most important people in {topic}?",
    "What are the main challenges of {topic} today?", "How has {topic} changed over the last century?",
    "Give me a one-sentence definition of {topic}.", "What books would you recommend to learn about {topic}?",
    "Is {topic} overrated? Give a balanced answer.", "What careers are related to {topic}?",
    "Explain {topic} like I'm five.", "In one or two sentences, what is {topic}?",
    "Write a detailed explanation of {topic}, with examples.", "What is the difference between {topic} and {other}?",
    "What's your opinion on {topic}? Explain why.", "Can you give me an example that shows how {topic} works?",
    "Answer briefly: why do people care about {topic}?",
    "I'm writing a school report on {topic}. What should I include?",
    "What is {topic}, why does it matter, and how is it related to {other}?",
    "What would a scientist say about {topic}, and what would a historian say?",
    "Which is more important for society, {topic} or {other}? Defend your answer.",
    "Explain {topic} using an analogy.", "What surprised people most when they first learned about {topic}?",
    "What is the most common question people ask about {topic}, and what is the answer?",
    "How would you explain {topic} to someone from the year 1800?", "Is it true that {topic} is hard to understand?",
    "What are the key ideas behind {topic}? Keep it short.",
    "Summarize what is known about {topic} in five bullet points.",
    "Give me a quick overview of {topic} and then one fun fact.", "How does {topic} affect everyday life?",
]
ROLEPLAY = [
    "Pretend you are {person}. Introduce yourself and talk about {topic}.",
    "You are {person}. Give me advice about {topic}.",
    "Act as {person} and describe a typical day at work.",
    "Imagine you are {person}. A visitor asks you about {topic}. What do you say?",
    "Role-play as {person} and answer my question: what do you think about {topic}?",
    "Pretend you are {person} writing a letter home. Mention {topic}.",
    "You are {person}. Convince me to care about {topic}.",
]
REASONING = [
    "Give step-by-step advice for someone who wants to learn about {topic}.",
    "Plan a one-week study schedule to learn about {topic}.",
    "What would happen if {topic} suddenly disappeared? Think it through.",
    "Extract the key terms a beginner must know about {topic} and define each one.",
    "What are the causes and effects of {topic}? Explain your reasoning.",
    "Design a simple experiment to learn something about {topic}.",
    "Argue for and against investing public money in {topic}, then give your conclusion.",
    "Explain step by step how you would teach {topic} to a group of ten-year-olds.",
    "Make a table comparing {topic} and {other} on three criteria.",
    "List the steps to get started with {topic}, numbered.",
    "Think step by step: how could a small town benefit from {topic}?",
    "Give three arguments for and three against the claim that {topic} matters more than {other}.",
    "Rank these from most to least important for a student and explain: {topic}, {other}, sleep.",
    "If you had one hour to learn about {topic}, how would you spend it? Explain your plan.",
    "What evidence would convince a skeptic about the importance of {topic}? Reason it out.",
    "Identify a common argument about {topic} and explain whether it is logically sound.",
]
ADVICE = [
    "My friend wants to get into {topic}. What advice would you give?",
    "I feel overwhelmed by {topic}. Any tips?",
    "What are common mistakes people make with {topic}, and how can I avoid them?",
    "How do I get started with {topic}? Give me step-by-step instructions.",
    "I have a job interview about {topic} tomorrow. How should I prepare?",
    "What's the best way to teach my kids about {topic}?",
    "How can I use what I know about {topic} to earn some money?",
    "Give me five practical tips related to {topic}.", "I'm {person}. How should I think about {topic}?",
    "How can I explain {topic} to my grandmother?",
    "Should I spend my weekend learning about {topic} or {other}? Help me decide.",
    "What questions should I ask an expert on {topic}?",
]


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 9)
    name, other, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
    price, pct = rng.randint(3, 90), rng.choice([10, 15, 20, 25, 30, 40, 50])
    forms = [
        f"{name} has {a} {item}. {other} gives {name} {b} more, then {name} shares them equally among {c} friends. "
        f"How many {item} does each friend get, and how many are left? Solve step by step.",
        f"A shop sells {item} at {c} dollars each. {name} buys {a} of them and pays with a {100 * c} dollar note. "
        "How much change does she get? Explain your reasoning.",
        f"What is {a} times {b} plus {c}? Show your work.",
        f"Solve for x: {c}x + {a} = {a + c * b}.",
        f"A train travels {a * 10} km in {c} hours. What is its average speed? Then how far does it go in {b} hours?",
        f"The sum of two numbers is {a + b} and their difference is {abs(a - b)}. Find the numbers.",
        f"A jacket costs {price} dollars. It is on sale for {pct}% off. What is the sale price?",
        f"{name} reads {b} pages a day. The book has {a * 10 + b} pages. How many days does {name} need to finish it?",
        f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
        f"{name} is {a} years old. {other} is {c} years older than twice {name}'s age. How old is {other}?",
        f"A recipe needs {c} eggs for {b} cookies. How many eggs are needed for {b * a} cookies?",
        f"{name} saves {price} dollars every week. How many weeks until {name} has {price * a} dollars?",
        f"What is {pct}% of {a * 20}? Explain.", f"Simplify the fraction {a * c}/{b * c}.",
        f"If a car uses {c} litres of fuel per 100 km, how much fuel does it need for {a * 10} km?",
        f"A class has {a + b} students; {a} of them are girls. What percentage are boys?",
        f"Find the derivative of f(x) = {c}x^3 + {b}x^2 - {a}x + {price}.",
        f"What is the probability of rolling a sum of {min(12, c + 2)} with two dice? Explain.",
        f"{name} buys {c} packs of {item} with {b} in each pack, gives away {a % (b * c) or 1} and eats {c}. "
        f"How many {item} are left? Think step by step.",
        f"{name} earns {price} dollars an hour and works {c} hours a day for {b % 6 + 2} days. "
        f"{name} spends {pct}% of it on rent. How much money is left?",
        f"A tank holds {a * 10} litres. A pipe fills it at {c} litres per minute and another drains it at "
        f"{max(1, c - 2)} litres per minute. How long does it take to fill the empty tank?",
        f"{name} ran {c} km on Monday, twice as far on Tuesday and {b} km on Wednesday. What was the average "
        "distance per day?",
        f"The price of a bike went up by {pct}% and then down by {pct}%. It was {price * 10} dollars at first. "
        "What does it cost now?",
        f"What is the area of a circle with radius {c} cm? And its circumference?",
        f"Convert {a * 100} grams to kilograms and {b} kilometres to metres.",
        f"Find the next two numbers in the sequence {c}, {c + b}, {c + 2 * b}, {c + 3 * b}. Explain the rule.",
        f"{name} and {other} can paint a fence in {c + 2} and {c + 4} hours alone. How long do they take together?",
        f"A school trip costs {price} dollars per student and {a + b} students go. The school pays {pct}%. "
        "How much do the families pay in total?",
        f"Is {a * b + 1} a prime number? Explain how you checked.",
        f"Solve the system: x + y = {a + b}, x - y = {a - b}.",
    ]
    return rng.choice(forms)


def _article(rng: random.Random, most: int = 10) -> str:
    topic, other = rng.sample(TOPICS, 2)
    city, company, name = rng.choice(CITIES), rng.choice(COMPANIES), rng.choice(NAMES)
    n, year = rng.randint(3, 900), rng.randint(1990, 2024)
    facts = [
        f"Researchers have studied {topic} for many decades.",
        f"Many people first hear about {topic} at school, but few understand it in depth.",
        f"Recent work links {topic} to {other} in surprising ways.",
        f"Experts say that public interest in {topic} grew quickly over the last ten years.",
        f"Critics argue that the importance of {topic} is often exaggerated.",
        f"A new report recommends more funding for teaching {topic}.",
        f"Local groups now organise monthly meetings about {topic} and {other}.",
        f"In {city}, officials said on Monday that {n} people had joined a new programme on {topic}.",
        f"{company} announced that it will invest in projects related to {topic} from {year + 1}.",
        f"\"We did not expect this much interest,\" said {name}, who leads the project.",
        "The first results are expected next spring, according to a spokesperson.",
        f"Some residents of {city} complained that the plan ignores {other}.",
        f"A survey found that {rng.randint(20, 80)}% of adults had changed their views on {topic}.",
        f"The idea was first proposed in {year} but was dropped because of its cost.",
    ]
    rng.shuffle(facts)
    return " ".join(facts[: rng.randint(3, most)])


def _summary(rng: random.Random) -> str:
    ask = rng.choice(["Summarize the following text in two sentences:", "Summarize this article:",
                      "Give a one-paragraph summary of the text below.", "What is the main point of this passage?",
                      "Write a headline and a short summary for this news story:",
                      "Summarize the following in three bullet points:"])
    return f"{ask}\n\n{_article(rng)}"


def _rag(rng: random.Random) -> str:
    """Answer a question from given passages (as in retrieval-augmented generation)."""
    passages = [_article(rng, most=6) for _ in range(rng.randint(2, 3))]
    topic = rng.choice(TOPICS)
    question = rng.choice([f"What do the passages say about {topic}?", "Who leads the project mentioned above?",
                           "Which company is investing, and when?", "What did the survey find?",
                           "According to the documents, why was the idea dropped?"])
    body = "\n\n".join(f"Document {i + 1}: {p}" for i, p in enumerate(passages))
    return f"Answer the question using the documents below.\n\n{body}\n\nQuestion: {question}"


def _extract(rng: random.Random) -> str:
    name, city, company = rng.choice(NAMES), rng.choice(CITIES), rng.choice(COMPANIES)
    day, n = rng.randint(1, 28), rng.randint(2, 40)
    texts = [
        f"Hi team, {name} from {company} here. Our workshop in {city} is on March {day}. We expect {n} guests "
        f"and need {n // 2 + 1} laptops. Please reply to {name.lower()}@example.com.",
        f"Order #{rng.randint(1000, 9999)}: {n} x {rng.choice(ITEMS)}, shipped to {city} on May {day}, "
        f"customer {name}, total {n * rng.randint(2, 9)} dollars, paid by card.",
        f"{company} reported revenue of {n * 3} million dollars in {city}, up {rng.randint(2, 30)}% from last "
        f"year. CEO {name} said the growth came from new customers.",
    ]
    ask = rng.choice(["Extract the names, places, dates and numbers from this text as JSON:",
                      "From the text below, list every person, company and city mentioned.",
                      "Turn this text into a table with one row per fact:",
                      "What are the key details in this message? Answer with a bulleted list."])
    return f"{ask}\n\n{rng.choice(texts)}"


def _rewrite(rng: random.Random) -> str:
    ask = rng.choice(["Rewrite the following paragraph in a formal tone:", "Make this text shorter and clearer:",
                      "Rewrite this for a ten-year-old reader:", "Correct the grammar and improve the style:",
                      "Turn this paragraph into a list of bullet points:", "Paraphrase this text:"])
    return f"{ask}\n\n{_article(rng)}"


GERMAN_SUBJECTS = ["Die Regierung", "Der Bürgermeister", "Die Polizei", "Das Unternehmen", "Der Trainer",
                   "Die Bundesregierung", "Eine neue Studie", "Der Verein", "Die Stadtverwaltung", "Das Gericht",
                   "Die Europäische Kommission", "Der Minister", "Die Zentralbank", "Die Schule",
                   "Ein Sprecher der Firma",
                   "Die Gewerkschaft", "Der Autohersteller", "Die Universität", "Das Krankenhaus", "Die Opposition"]
GERMAN_TIMES = ["am Montag", "gestern", "in der vergangenen Woche", "am Wochenende", "im letzten Jahr",
                "heute Morgen", "nach langen Verhandlungen", "überraschend", "am Dienstagabend", "Anfang des Monats"]
GERMAN_ACTS = ["einen neuen Plan vorgestellt", "die Preise erhöht", "mehr Geld für Schulen gefordert",
               "das Projekt gestoppt", "einen Vertrag unterschrieben", "neue Regeln beschlossen",
               "die Ergebnisse veröffentlicht", "hundert neue Mitarbeiter eingestellt", "das wichtige Spiel verloren",
               "eine Untersuchung eingeleitet", "die Steuern gesenkt", "den Bau einer neuen Brücke angekündigt",
               "vor den Folgen des Klimawandels gewarnt", "einen Rekordgewinn gemeldet",
               "die Verhandlungen abgebrochen"]
GERMAN_AFTER = ["", "", " Kritiker halten das für einen Fehler.", " Die Entscheidung war lange umstritten.",
                " Viele Bürger reagierten erleichtert.", " Weitere Einzelheiten sollen nächste Woche folgen.",
                " Das teilte ein Sprecher am Abend mit.", " Die Opposition fordert nun eine Debatte im Parlament."]
GERMAN_BECAUSE = ["", "", "", ", weil die Kosten stark gestiegen sind", ", nachdem sich viele Bürger beschwert hatten",
                  ", obwohl die Lage schwierig bleibt", ", um die Wirtschaft zu stärken"]


def _german(rng: random.Random) -> str:
    """A news-like German sentence (or two) from parts: thousands of inputs to translate into English."""
    return (f"{rng.choice(GERMAN_SUBJECTS)} hat {rng.choice(GERMAN_TIMES)} {rng.choice(GERMAN_ACTS)}"
            f"{rng.choice(GERMAN_BECAUSE)}.{rng.choice(GERMAN_AFTER)}")


def _translate(rng: random.Random) -> str:
    if rng.random() < 0.35:
        form = rng.choice(["Translate German to English: {s}", "Translate the following German text to English.\n{s}",
                           "Translate into English:\n{s}", "Please translate this from German into English: {s}"])
        return form.format(s=_german(rng))
    if rng.random() < 0.4:
        lang, sentence = rng.choice(FOREIGN)
        form = rng.choice(["Translate into English: {s}", "Translate the following {lang} text to English.\n{s}",
                           "What does \"{s}\" mean in English?", "Translate from {lang} to English: {s}"])
        return form.format(lang=lang, s=sentence)
    lang, sentence = rng.choice(LANGUAGES), rng.choice(SENTENCES)
    form = rng.choice(["Translate into {lang}: {s}", "Translate the following sentence from English to {lang}.\n{s}",
                       "How do you say \"{s}\" in {lang}?"])
    return form.format(lang=lang, s=sentence)


def _code(rng: random.Random) -> str:
    task, lang = rng.choice(CODE_TASKS), rng.choice(LANGS_CODE)
    if rng.random() < 0.3:
        form = rng.choice(["Explain what this code does:\n\n{code}", "Find and fix the bug in this code:\n\n{code}",
                           "Add comments and type hints to this code:\n\n{code}",
                           "Rewrite this code in {lang}:\n\n{code}"])
        return form.format(code=rng.choice(SNIPPETS), lang=lang)
    form = rng.choice(["Write a {lang} function that {task}.", "Show me {lang} code that {task}, and explain it.",
                       "How do I write a program in {lang} that {task}?",
                       "Write a {lang} function that {task}, with a few test cases.",
                       "What is the time complexity of a function that {task}? Give an example in {lang}."])
    return form.format(lang=lang, task=task)


def _templated(rng: random.Random, templates: list[str]) -> str:
    topic, other = rng.sample(TOPICS, 2)
    return rng.choice(templates).format(topic=topic, other=other, person=rng.choice(PEOPLE))


def make_prompts(n: int, seed: int = 0) -> list[str]:
    """n varied instructions (deterministic for a seed), mixing every kind of task in fixed shares."""
    rng = random.Random(seed)
    kinds = [(lambda r: _templated(r, WRITING), 3), (lambda r: _templated(r, QA), 4),
             (lambda r: _templated(r, ADVICE), 1), (lambda r: _templated(r, ROLEPLAY), 1),
             (lambda r: _templated(r, REASONING), 2),
             (_math, 3), (_summary, 2), (_translate, 2), (_code, 3), (_rag, 1), (_extract, 1), (_rewrite, 1)]
    pool = [make for make, weight in kinds for _ in range(weight)]
    seen: set[str] = set()
    out: list[str] = []
    tries = 0
    while len(out) < n:
        prompt = rng.choice(pool)(rng)
        tries += 1
        if prompt not in seen or tries > 50 * n:  # repeats only once the generator runs out of new prompts
            seen.add(prompt)
            out.append(prompt)
    return out


# Two-stage self-instruct: the target first writes source texts (stage 1), then answers requests
# about those texts pasted into the prompt (stage 2), as people ask a model to summarise, extract
# from, answer questions about or rewrite long documents (300-800 prompt tokens). Nothing here
# comes from Spec-Bench: the texts are the target's own, the requests our own templates.

SOURCE_KINDS = {  # kind -> requests that make the target write a source text of that kind
    "article": ["Write a news article of about 300 words about {topic}. Include names, places, dates and numbers.",
                "Write a detailed newspaper report about a new development in {topic} in {city}, with quotes."],
    "report": ["Write a short business report from {company} about {topic}, with figures and recommendations.",
               "Write a one-page research summary about {topic} with background, findings and conclusions."],
    "story": ["Write a story of about 300 words about {person} and {topic}.",
              "Write a short story set in {city} in which {name} learns something about {topic}."],
    "product": ["Write a detailed product description for a new product from {company} related to {topic}, "
                "with features, price and specifications."],
    "email": ["Write a long email from {name} at {company} to the whole team about a project on {topic}, "
              "with dates, tasks and a deadline."],
    "code": ["Write a {lang} program that {task}, with comments, and explain how it works.",
             "Write a {lang} class that {task}, then show how to use it."],
    "dialogue": ["Write a dialogue between {person} and {name} about {topic}, at least twelve lines long.",
                 "Write an interview transcript in which a journalist asks {person} about {topic}."],
}
FOLLOW_UPS = {  # what is asked about one pasted text; {kind} names it ("the article")
    "summarize": ["Summarize the following {kind} in two sentences:", "Summarize this {kind}:",
                  "Write a one-paragraph summary of the {kind} below.", "Give a three-bullet summary of this {kind}.",
                  "What is the main point of this {kind}? Answer briefly.",
                  "Write a headline and a summary for this {kind}:"],
    "extract": ["Extract every name, place, date and number from this {kind} as JSON:",
                "List the key facts of the {kind} below as bullet points.",
                "Extract the people mentioned in this {kind} and what each of them does.",
                "Make a table of the important details in this {kind}."],
    "question": ["Read the {kind} below and answer: who is involved, and what happens?",
                 "Based on the {kind} below, what are the three most important points?",
                 "What questions does this {kind} leave unanswered? List three and explain why.",
                 "According to this {kind}, what is said about {topic}?"],
    "rewrite": ["Rewrite the following {kind} in a formal tone:", "Rewrite this {kind} for a ten-year-old reader:",
                "Make this {kind} shorter and clearer:", "Paraphrase the {kind} below.",
                "Correct the grammar and improve the style of this {kind}:"],
    "plain": ["Translate this {kind} into plain English that anyone can understand:",
              "Explain the following {kind} in plain, simple English:"],
}


@dataclass(frozen=True)
class SourcePrompt:
    prompt: str  # the stage-1 request
    kind: str  # a key of SOURCE_KINDS
    topic: str


def make_source_prompts(n: int, seed: int = 0) -> list[SourcePrompt]:
    """n stage-1 requests for source texts, cycling through the kinds (deterministic for a seed)."""
    rng = random.Random(seed + 7919)
    kinds = sorted(SOURCE_KINDS)
    out = []
    for i in range(n):
        kind, topic = kinds[i % len(kinds)], rng.choice(TOPICS)
        template = rng.choice(SOURCE_KINDS[kind])
        prompt = template.format(topic=topic, city=rng.choice(CITIES), company=rng.choice(COMPANIES),
                                 person=rng.choice(PEOPLE), name=rng.choice(NAMES), lang=rng.choice(LANGS_CODE),
                                 task=rng.choice(CODE_TASKS))
        out.append(SourcePrompt(prompt, kind, topic))
    return out


def usable_text(text: str, min_words: int = 60) -> bool:
    """A stage-1 text worth pasting: long enough, and not a degenerate loop of the same words."""
    words = text.split()
    return len(words) >= min_words and len(set(words)) / len(words) >= 0.3


def make_followup_prompts(sources: list[SourcePrompt], texts: list[str], n: int, seed: int = 0,
                          max_chars: int = 3200) -> list[str]:
    """n stage-2 requests, each pasting one of the usable `texts` (the target's answers to `sources`),
    or for one in four two or three of them as numbered documents with a question (retrieval style).
    max_chars caps the pasted material (about 800 tokens)."""
    pool = [(s, t.strip()[:max_chars]) for s, t in zip(sources, texts) if usable_text(t)]
    if not pool:
        return []
    rng = random.Random(seed + 104729)
    names = {"article": "article", "report": "report", "story": "story", "product": "product description",
             "email": "email", "code": "code", "dialogue": "dialogue"}
    out = []
    for i in range(n):
        source, text = pool[i % len(pool)] if i < len(pool) else rng.choice(pool)
        if rng.random() < 0.25 and len(pool) > 1:
            docs = [text] + [t for _, t in rng.sample(pool, min(2, len(pool) - 1)) if t != text]
            while len(docs) > 1 and sum(map(len, docs)) > max_chars:
                docs.pop()
            body = "\n\n".join(f"Document {j + 1}:\n{d}" for j, d in enumerate(docs))
            question = rng.choice([f"What do the documents say about {source.topic}?",
                                   "Which people and organisations are mentioned, and in which document?",
                                   "Summarize what the documents have in common.",
                                   "Answer using only the documents: what is the most important fact in each?"])
            out.append(f"Answer the question using the documents below.\n\n{body}\n\nQuestion: {question}")
            continue
        task = rng.choice(sorted(FOLLOW_UPS))
        ask = rng.choice(FOLLOW_UPS[task]).format(kind=names[source.kind], topic=source.topic)
        out.append(f"{ask}\n\n{text}")
    return out


# Self-instruct questions: the target first writes numbered lists of questions that people ask
# about a topic (stage `ask`, greedy: a small target's sampled lists wander off), then answers each
# question it wrote (stage `ans`), some with a wish about the answer (short, detailed, for a child,
# step by step, an opinion) or two of a list's questions at once. The questions are the target's
# own, so they reach sub-topics and phrasings that our templates do not; the lists are data too.

ASKERS = ["a worried parent", "a curious child", "a new employee", "a tourist", "a journalist", "a university student",
          "a complete beginner", "an expert", "a skeptic", "a small business owner", "a retired engineer",
          "a high school teacher", "a patient", "a first-year medical student", "a young voter", "a novelist"]
QUESTION_LISTS = [
    "List five questions people often ask about {topic}.",
    "Write a numbered list of 5 different questions a student could ask a teacher about {topic}.",
    "List five questions {asker} might ask about {topic}.",
    "List five things someone might ask an AI assistant to help with related to {topic}. Write each as a request.",
    "List five questions {asker} might ask about {topic} and {other}.",
    "List five 'how' and 'why' questions about {topic}.",
    "Write five questions, numbered, that test someone's knowledge of {topic}.",
    "List five practical questions someone might have about {topic} in everyday life.",
    "List five questions about the history of {topic}.",
]
ANSWER_WISHES = ["{q}", "{q}", "{q}", "{q}", "{q} Explain it like I'm five.", "{q} Answer in one or two sentences.",
                 "{q} Please give a detailed answer with examples.", "{q} Think step by step.",
                 "I have a question: {q}", "Quick question: {q}", "{q} Give your opinion and explain why.",
                 "{q} Answer with a short list.", "{q} Also, {q2}", "{q} And {q2}"]


def make_question_list_prompts(n: int, seed: int = 0) -> list[str]:
    """n stage-1 requests for lists of questions (deterministic for a seed)."""
    rng = random.Random(seed + 15485863)
    out = []
    for _ in range(n):
        topic, other = rng.sample(TOPICS, 2)
        out.append(rng.choice(QUESTION_LISTS).format(topic=topic, other=other, asker=rng.choice(ASKERS)))
    return out


def parse_questions(text: str, most: int = 5) -> list[str]:
    """The distinct items of a numbered or bulleted list in `text` that read as a request: 4 to 40
    words, ending in '?' or '.' (a heading such as "How to water plants:" is not one)."""
    out: list[str] = []
    for line in text.splitlines():
        match = re.match(r"\s*(?:\d{1,2}[.)]|[-*•])\s+(.+)$", line)
        if not match:
            continue
        item = match.group(1).strip().strip("*").strip().strip('"“”').strip()
        if 4 <= len(item.split()) <= 40 and item[-1] in "?." and "**" not in item and item not in out:
            out.append(item)
    return out[:most]


def make_question_prompts(lists: list[str], seed: int = 0) -> list[str]:
    """Stage-2 requests: every question parsed from the target's `lists`, in order, some with a wish
    about the answer or joined to another question of the same list."""
    rng = random.Random(seed + 32452843)
    out = []
    for text in lists:
        questions = parse_questions(text)
        for i, q in enumerate(questions):
            wish = rng.choice(ANSWER_WISHES)
            if "{q2}" in wish and len(questions) < 2:
                wish = "{q}"
            q2 = questions[(i + 1) % len(questions)]
            out.append(wish.format(q=q, q2=q2[0].lower() + q2[1:]))
    return out
