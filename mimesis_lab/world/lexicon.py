"""The closed vocabulary of the synthetic world: every name, place, thing and opinion it can mention.

Small on purpose: a 2-layer model with a ~4k byte-level BPE should see every word of the
validation split in training. Nothing here is copied from a public dataset.
"""
from __future__ import annotations

FIRST_NAMES = ("anna", "ben", "carla", "david", "emma", "felix", "grace", "hugo", "ines", "jack", "kate", "leo",
               "maria", "nina", "omar", "paula", "ravi", "sara", "tom", "yuki")
LAST_NAMES = ("lopez", "smith", "garcia", "chen", "miller", "silva", "novak", "khan", "rossi", "weber", "brown",
              "kim", "costa", "ward", "fischer", "patel")

#: home towns (US style, as ABCD and tau-bench addresses): city -> (state, zip prefix, area code)
HOME_TOWNS = {
    "austin": ("tx", "787", "512"), "denver": ("co", "802", "303"), "boston": ("ma", "021", "617"),
    "seattle": ("wa", "981", "206"), "chicago": ("il", "606", "312"), "miami": ("fl", "331", "305"),
}
STREETS = ("maple", "oak", "cedar", "pine", "elm", "lake", "hill", "river")
STREET_TYPES = ("st", "ave", "rd", "ln", "ct", "dr")

AGES = ("18-24", "25-34", "35-44", "45-54", "55-64")
GENDERS = ("Female", "Male", "Non-binary")
EDUCATION = ("High school", "Bachelor's degree", "Master's degree")
JOBS = ("nurse", "teacher", "engineer", "student", "designer", "chef", "lawyer", "driver")
FREQUENCY = ("Daily", "Weekly", "Monthly")
SURVEY_PURPOSES = ("Travel planning", "Shopping", "Games", "Writing", "Information seeking")

MEMBER_LEVELS = ("guest", "bronze", "silver", "gold")
PAYMENT_METHODS = ("credit card", "debit card", "paypal", "gift card")
COLOURS = ("black", "blue", "red", "green", "white")
SIZES = ("S", "M", "L")
PETS = ("none", "dog", "cat")

# ----------------------------------------------------------------------------- travel
TRAVEL_CITIES = ("lisbon", "rome", "paris", "berlin", "madrid", "prague", "vienna", "athens")
#: trip purpose -> (phrase in a request, area weights, amenity weights, budget shift)
PURPOSES = {
    "work": ("work trip", {"centre": 6, "station": 3, "old town": 1}, {"wifi": 7, "gym": 2, "breakfast": 1}, 1),
    "family": ("family holiday", {"beach": 5, "quiet": 4, "centre": 1},
               {"family rooms": 6, "pool": 3, "parking": 1}, 0),
    "beach": ("beach break", {"beach": 8, "quiet": 2}, {"pool": 6, "breakfast": 2, "parking": 2}, 0),
    "romantic": ("romantic weekend", {"old town": 6, "quiet": 3, "beach": 1}, {"spa": 7, "breakfast": 3}, 1),
    "backpacking": ("backpacking trip", {"station": 6, "centre": 3, "old town": 1}, {"breakfast": 7, "wifi": 3}, -2),
    "city": ("city break", {"old town": 6, "centre": 4}, {"gym": 6, "breakfast": 2, "wifi": 2}, 0),
}
AREAS = ("centre", "station", "old town", "beach", "quiet")
#: area -> (option tag, how a user states it, the keyword the travel gym rewards)
AREA_PHRASE = {"centre": ("city centre", "in the city centre", "centre"),
               "station": ("near station", "near the station", "station"),
               "old town": ("old town", "in the old town", "old town"),
               "beach": ("beach", "near the beach", "beach"),
               "quiet": ("quiet", "in a quiet street", "quiet")}
AMENITIES = ("wifi", "pool", "breakfast", "parking", "pet friendly", "gym", "spa", "family rooms")
#: amenity -> how a user states it
AMENITY_PHRASE = {"wifi": "good wifi", "pool": "a pool", "breakfast": "breakfast included",
                  "parking": "free parking", "pet friendly": "pet friendly rooms", "gym": "a gym",
                  "spa": "a spa", "family rooms": "family rooms"}
PRICE_BANDS = (60, 80, 100, 120, 150, 200)
HOTEL_ADJ = ("blue", "golden", "green", "royal", "little", "grand", "sunny", "silver")
HOTEL_NOUN = ("inn", "house", "lodge", "palace", "rooms", "suites", "garden", "harbour")

CUISINES = ("italian", "thai", "sushi", "vegan", "seafood", "mexican")
COMPANIONS = ("alone", "partner", "kids", "friends")
TRANSPORT = ("car", "train", "plane")

# ----------------------------------------------------------------------------- shop (ABCD + tau)
ABCD_BRANDS = ("calvin_klein", "guess", "tommy_hilfiger", "michael_kors")
ABCD_TYPES = ("jeans", "shirt", "jacket", "boots")
ABCD_PRICES = {"jeans": (60, 80), "shirt": (30, 50), "jacket": (90, 120), "boots": (70, 110)}
#: tau products: name -> option name -> values (every combination is a variant)
TAU_PRODUCTS = {
    "t-shirt": {"color": ("black", "blue", "white"), "size": ("S", "M", "L")},
    "hoodie": {"color": ("black", "green", "red"), "size": ("M", "L")},
    "sneakers": {"color": ("white", "black", "blue"), "size": ("S", "M", "L")},
    "backpack": {"color": ("black", "blue", "green")},
    "water bottle": {"color": ("blue", "red", "white")},
    "desk lamp": {"color": ("black", "white")},
}
TAU_BASE_PRICE = {"t-shirt": 20, "hoodie": 45, "sneakers": 70, "backpack": 55, "water bottle": 15, "desk lamp": 35}

# ----------------------------------------------------------------------------- games
#: telepathy entities: category -> entity -> the attributes that are true of it
ATTRIBUTES = {
    "animal": ("has fur", "can fly", "lives in water", "is a pet", "is bigger than a dog", "has four legs"),
    "food": ("is italian", "is spicy", "has meat", "is eaten hot", "is sweet", "is from asia"),
    "city": ("is a capital", "is by the sea", "is in the south", "has a famous tower", "is very old", "is big"),
}
ENTITIES = {
    "animal": {"cat": ("has fur", "is a pet", "has four legs"),
               "dog": ("has fur", "is a pet", "has four legs"),
               "horse": ("has fur", "is bigger than a dog", "has four legs"),
               "rabbit": ("has fur", "is a pet", "has four legs"),
               "parrot": ("can fly", "is a pet"),
               "dolphin": ("lives in water", "is bigger than a dog"),
               "owl": ("can fly",),
               "goldfish": ("lives in water", "is a pet"),
               "goat": ("has fur", "has four legs"),
               "turtle": ("lives in water", "is a pet", "has four legs")},
    "food": {"pizza": ("is italian", "is eaten hot"), "pasta": ("is italian", "is eaten hot"),
             "sushi": ("is from asia",), "curry": ("is spicy", "has meat", "is eaten hot", "is from asia"),
             "tacos": ("is spicy", "has meat", "is eaten hot"), "gelato": ("is italian", "is sweet"),
             "burger": ("has meat", "is eaten hot"), "pancakes": ("is sweet", "is eaten hot"),
             "ramen": ("has meat", "is eaten hot", "is from asia"), "salad": ()},
    "city": {"lisbon": ("is a capital", "is by the sea", "is in the south", "is very old"),
             "rome": ("is a capital", "is in the south", "is very old", "is big"),
             "paris": ("is a capital", "has a famous tower", "is very old", "is big"),
             "berlin": ("is a capital", "has a famous tower", "is big"),
             "madrid": ("is a capital", "is in the south", "is big"),
             "prague": ("is a capital", "is very old"),
             "vienna": ("is a capital", "is very old", "is big"),
             "athens": ("is a capital", "is by the sea", "is in the south", "is very old")},
}
#: attribute -> the yes/no question an assistant asks about it
ATTRIBUTE_QUESTION = {
    "has fur": "does it have fur?", "can fly": "can it fly?", "lives in water": "does it live in water?",
    "is a pet": "do people keep it as a pet?", "is bigger than a dog": "is it bigger than a dog?",
    "has four legs": "does it have four legs?", "is italian": "is it italian?", "is spicy": "is it spicy?",
    "has meat": "does it have meat in it?", "is eaten hot": "do you eat it hot?", "is sweet": "is it sweet?",
    "is from asia": "is it from asia?", "is a capital": "is it a capital?", "is by the sea": "is it by the sea?",
    "is in the south": "is it in the south?", "has a famous tower": "does it have a famous tower?",
    "is very old": "is it very old?", "is big": "is it a big city?",
}
#: cuisine -> foods a user who likes it tends to think of
CUISINE_FOODS = {"italian": ("pizza", "pasta", "gelato"), "thai": ("curry", "salad"), "sushi": ("sushi", "ramen"),
                 "vegan": ("salad", "pancakes"), "seafood": ("sushi", "pasta"), "mexican": ("tacos", "burger")}

#: persuasion claims: id -> (claim, reasons against, reasons for); each reason is (text, key word an
#: argument must address to move the stance)
CLAIMS = {
    "pets": ("hotels should allow pets in every room.",
             (("pets are noisy at night", "noise"), ("some guests have allergies", "allergies"),
              ("rooms get dirty", "cleaning")),
             (("i travel with my pet", "pet"), ("pets are family", "family"))),
    "tax": ("tourist taxes should be higher.",
            (("trips are already too expensive", "cost"), ("the money never helps locals", "locals")),
            (("crowds ruin old towns", "crowds"), ("cities need money for repairs", "repairs"))),
    "transit": ("public transit should be free.",
                (("someone has to pay for it", "pay"), ("buses are slow anyway", "slow")),
                (("i take the bus every day", "bus"), ("cars clog the streets", "traffic"))),
    "online": ("online shopping is better than going to stores.",
               (("returns are a pain", "returns"), ("i like to try things on", "sizes")),
               (("it saves me time", "time"), ("prices are lower online", "prices"))),
    "cleaning": ("hotels should stop daily room cleaning.",
                 (("i pay for a clean room", "clean"), ("cleaners would lose work", "jobs")),
                 (("it wastes water", "water"), ("i like my privacy", "privacy"))),
    "flights": ("short flights should be replaced by trains.",
                (("trains take too long", "slow"), ("train tickets cost more", "cost")),
                (("flights hurt the climate", "climate"), ("trains are more relaxing", "relaxing"))),
}

# ----------------------------------------------------------------------------- intention
#: vague task kind -> (category, task texts (with an optional public hint), details)
#: a detail is (description, importance, inquiry, the user trait it is drawn from)
INTENTIONS = {
    "trip": ("Travel Planning", ("plan a weekend trip for me.", "plan a {purpose} for me."),
             (("destination city", "3", "which city would you like to visit?", "fav_city"),
              ("budget per night", "2", "what budget per night do you have in mind?", "price"),
              ("travel companions", "2", "who is travelling with you?", "companions"),
              ("mode of transport", "1", "which mode of transport do you want?", "transport"))),
    "dinner": ("Food", ("find me a place to eat tonight.", "find me a good place to eat tonight."),
               (("type of cuisine", "3", "what cuisine do you feel like?", "cuisine"),
                ("price per person", "2", "how much do you want to spend per person?", "food_price"),
                ("dining companions", "1", "who is joining you for dinner?", "companions"))),
    "hotel": ("Travel Planning", ("book me a hotel.", "book me a hotel for my {purpose}."),
              (("hotel area", "3", "which area should the hotel be in?", "area"),
               ("must have amenity", "2", "which amenity must the hotel have?", "amenity"),
               ("price per night", "2", "what is your budget per night?", "price"))),
    "gift": ("Shopping", ("help me pick a gift for my friend.", "i need a gift idea for my friend."),
             (("favourite colour", "2", "what colour does your friend like?", "colour"),
              ("gift budget", "3", "how much do you want to spend on the gift?", "gift_budget"),
              ("kind of gift", "2", "what kind of gift do you have in mind?", "gift_kind"))),
}
GIFT_KINDS = ("backpack", "hoodie", "sneakers", "water bottle", "desk lamp")
GIFT_BUDGETS = (20, 40, 60)
FOOD_PRICES = (15, 25, 40)

# ----------------------------------------------------------------------------- turtle stories
#: (needs, title, surface, solution, key facts); slots: {name} {city} {pet} {job} {amenity}.
#: TurtleGym's judge covers a key fact when half of its content words occur in the explanation, so
#: every key fact has fewer than half of its content words in the surface story and the title: a
#: restatement of what the player was shown covers nothing, and each fact needs a hidden word the
#: host can confirm ("{name} is a {job}" would be covered by the name alone, so it reads "works as").
TURTLE_STORIES = (
    ("pet", "the happy checkout",
     "{name} left a nice hotel in {city} after one night and was glad to go.",
     "{name} travels with a {pet}. the hotel did not allow pets, so {name} moved to a pet friendly hotel.",
     ("{name} travels with a {pet}", "the hotel did not allow pets", "{name} moved to a pet friendly hotel")),
    ("job", "the early breakfast",
     "{name} paid for breakfast at a hotel in {city} every day but never ate it.",
     "{name} works as a {job} and started work at dawn. breakfast opened too late, so {name} ate at work.",
     ("{name} works as a {job}", "{name} started work at dawn", "breakfast opened too late")),
    ("amenity", "the unused key",
     "{name} picked a hotel in {city} for its {amenity} and then never used it.",
     "{name} booked the hotel for a friend who needed the {amenity}. the friend got sick and stayed home.",
     ("{name} booked it for a friend", "the friend needed it", "the friend got sick and stayed home")),
    ("pet", "the quiet night",
     "{name} asked for the noisiest room in a hotel in {city}.",
     "{name} travels with a pet {pet} that gets restless in silence. the noise of the street calmed the {pet} "
     "all night.",
     ("{name} travels with a pet {pet}", "the {pet} is calm with noise", "street noise calmed the {pet}")),
    ("job", "the empty suitcase",
     "{name} flew to {city} with a big empty suitcase and came home happy.",
     "{name} works as a {job} and went to {city} to buy tools for work. the suitcase came home full of tools.",
     ("{name} works as a {job}", "{name} went to buy tools", "the tools were for work")),
    ("amenity", "the cold pool",
     "{name} complained that a hotel in {city} had a warm {amenity}.",
     "{name} swims every day and trains for cold water swimming. a warm {amenity} was useless for training.",
     ("{name} trains for cold water swimming", "{name} swims every day", "warm water was useless for training")),
)

# ----------------------------------------------------------------------------- function gym
FUNCTION_RULES = ("a + b * c - d", "(a + b) * c", "a * b - c * d", "a ** 2 + b - c", "a * b * c - d",
                  "(a - b) * (c + d)", "a + b + c * d", "c * (a + d) - b", "a * b + c ** 2", "(a + c) * (b - d)",
                  "d * d - a * b", "a + 2 * b + 3 * c")
