"""Short texts the tests embed: one home, imported by the test modules that share them."""

# Ten short documents on unrelated topics, of varied lengths (one is very short).
SHORT_DOCS = [
    "The cat sat on the mat.",
    "Rain forms when water vapour condenses into droplets.",
    "Stocks fell sharply on Monday after the announcement.",
    "Proteins fold into three-dimensional shapes that determine their function in the cell.",
    "A short one.",
    "Glaciers are retreating in most mountain ranges of the world.",
    "The court ruled in favour of the plaintiff.",
    "Neural networks learn representations from data.",
    "Coffee contains caffeine.",
    "The orchestra played Beethoven's ninth symphony to a full hall.",
]

# Twelve one-sentence documents, one topic each; some are cut at 8 tokens, some are not.
TOPIC_DOCS = [
    "Glaciers flow slowly downhill under their own weight, sliding over meltwater at their base.",
    "Rain forms when water vapour in clouds condenses into droplets heavy enough to fall.",
    "Leonardo da Vinci painted the Mona Lisa in the early sixteenth century.",
    "Share prices drop when investors expect lower profits or higher interest rates.",
    "Vaccines train the immune system to recognise a pathogen without causing the disease.",
    "Photosynthesis converts light, water and carbon dioxide into sugar and oxygen in plants.",
    "The Western Roman Empire ended in 476 when the last emperor was deposed.",
    "Bees collect nectar from flowers and evaporate it in the hive to make honey.",
    "A black hole is a region of space where gravity is so strong that not even light escapes.",
    "A compiler translates source code into machine code through parsing, analysis and code generation.",
    "Sunlight scatters off air molecules, and blue light scatters the most, so the sky looks blue.",
    "Giant pandas eat almost nothing but bamboo, up to forty kilograms a day.",
]
