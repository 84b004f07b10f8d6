#!/usr/bin/env python3
"""Writes ordered fact streams for `engram eval current` (dev data):

    python3 lab/data/current/make_streams.py

writes lab/data/current/stream_500.jsonl, stream_2500.jsonl and
stream_20000.jsonl: 500, 2,500 and 20,000 short statements written in
order into one namespace (one memory each, event_time one minute apart from
2024-01-01T00:00:00Z), then 120 questions each (100, then 20 "absent").
Deterministic: every stream draws from its own random.Random(SEED + size)
(questions: SEED + size + 1; absent questions: a string seed of their own)
and nothing depends on set or dict order, so a rerun writes byte-identical
files. Python 3.11, standard library only.

Names. Subject and value names come from the public data in
../shared/data/hipporag/ beside the repository (see its SOURCE.md): people (2Wiki biography
passages, "directed by ..." mentions, MuSiQue OpenIE subjects of born/died/
married triples), films (2Wiki "is a 19xx ... film" passages), companies,
film studios, record labels, football clubs, universities, societies and
regions (names ending in Company/Group/Bank/..., Pictures/Studios, Records,
FC/United/Football Club, University, Society/Association/..., Province/
County/Region/... found in the passages and OpenIE entities), bands (short
2Wiki film titles not used as films, song/album titles), brands (surnames of
harvested people, never seen in lower case; people with those surnames are
left out). Cities, countries, languages
and occupations are fixed lists below, kept only where the name occurs in
the passages (cities carry their real country, so "city in country" facts
are true). Where a pool runs short for the 20,000 stream it is topped up by
recombining harvested parts (first name + surname of harvested people,
surname + industry for companies, city + Rovers/Athletic/... for clubs).
Names holding update wording ("New York") are dropped.

Stream design.
- 27 single-valued relations, each with 2-3 statement templates; one
  template is drawn per (subject, relation) fact and every later version of
  that fact uses exactly the same template with a different value (no
  update wording: asserted against BANNED below).
- About a third of the overridable facts get one later version, some two,
  at random later positions (all versions get sorted uniform keys).
- 4 many-valued relations (child, member of, speaks, has visited): a
  subject gets 2-3 values at different times, all true.
- Crowding: many subjects per type, each with several relations.
- Questions, 2 templates per relation, never a statement template:
  55 current (fact overridden: gold = latest version, stale = earlier ones),
  15 current (never overridden, stale empty), 10 many (gold = every value's
  statement), 10 past (fact overridden once: gold = the earlier version,
  also = the latest), 10 chain (2-4 facts; gold = the final fact about the
  current intermediate value, path = the current chain's facts, stale =
  earlier versions of chain facts and the next fact about each old
  intermediate value). Chain questions carry "relations", the relations
  along the chain; their "relation" is those names joined with ">".
- Then 20 absent questions (see absent_questions): a known subject (2+
  statements) asked, with a "current" template, for a relation its type
  allows but the stream never states for it; gold, stale, also and path
  are empty. They come from a separate RNG made after everything else, so
  the memories and the first 100 questions are as they were without them.
"""

import json
import os
import random
import re
import sys
from collections import Counter, defaultdict

SEED = 20240101
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "shared", "data", "hipporag") + os.sep
SIZES = (500, 2500, 20000)
N_QUESTIONS = dict(current_over=55, current_plain=15, many=10, past=10, chain=10)
N_ABSENT = 20  # appended after the others, from an RNG of their own

# Update wording: never in a statement (asserted), and no name holds it.
BANNED = re.compile(
    r"\b(now|moved?|moving|no longer|new|newly|currently|current|changed?|since|"
    r"former|formerly|previous|previously|anymore|instead|switched|became|latest|"
    r"recently|updated?|today|used to|no more|replaced|succeeded|took over|until|"
    r"before|after|left|joined|transferred)\b",
    re.I,
)

# --------------------------------------------------------------------------
# Fixed lists (kept only where the name occurs in the passages).

CITIES = {
    "France": "Paris Lyon Marseille Toulouse Bordeaux Lille Nantes Nice Strasbourg Rennes Grenoble Montpellier Reims Dijon Cannes Rouen Nancy Avignon Toulon Le_Havre",
    "Germany": "Berlin Munich Hamburg Cologne Frankfurt Stuttgart Dresden Leipzig Bonn Hanover Nuremberg Bremen Düsseldorf Dortmund Essen Heidelberg Mainz Regensburg Magdeburg Potsdam Kiel",
    "Italy": "Rome Milan Naples Turin Florence Venice Bologna Genoa Palermo Verona Pisa Trieste Bari Parma Mantua Siena Catania Padua",
    "Spain": "Madrid Barcelona Valencia Seville Bilbao Zaragoza Málaga Granada Córdoba Salamanca Pamplona Toledo Valladolid Cádiz",
    "Portugal": "Lisbon Porto Coimbra Braga Faro",
    "United Kingdom": "London Manchester Liverpool Birmingham Leeds Bristol Glasgow Edinburgh Cardiff Belfast Oxford Cambridge Sheffield Nottingham Brighton Aberdeen Dundee Leicester Southampton York Bath Coventry Swansea Newport Norwich Plymouth Salisbury Lincoln",
    "Ireland": "Dublin Cork Galway Limerick Waterford Sligo",
    "Netherlands": "Amsterdam Rotterdam Utrecht Eindhoven Haarlem Groningen Leiden Maastricht Delft",
    "Belgium": "Brussels Antwerp Ghent Bruges Liège Leuven Ostend",
    "Switzerland": "Zurich Geneva Bern Basel Lausanne Lucerne Lugano",
    "Austria": "Vienna Salzburg Graz Innsbruck Linz Klagenfurt",
    "Denmark": "Copenhagen Aarhus Odense Aalborg",
    "Sweden": "Stockholm Gothenburg Malmö Uppsala Lund",
    "Norway": "Oslo Bergen Trondheim Stavanger Tromsø",
    "Finland": "Helsinki Tampere Turku Oulu Espoo",
    "Iceland": "Reykjavík",
    "Poland": "Warsaw Kraków Gdańsk Wrocław Poznań Łódź Lublin Szczecin",
    "Czech Republic": "Prague Brno Ostrava Plzeň",
    "Hungary": "Budapest Debrecen Szeged Pécs",
    "Romania": "Bucharest Cluj-Napoca Iași Timișoara Constanța",
    "Bulgaria": "Sofia Plovdiv Varna Burgas",
    "Greece": "Athens Thessaloniki Patras Heraklion Larissa",
    "Croatia": "Zagreb Split Rijeka Dubrovnik",
    "Serbia": "Belgrade Novi_Sad Niš",
    "Slovenia": "Ljubljana Maribor",
    "Slovakia": "Bratislava Košice",
    "Albania": "Tirana Durrës Shkodër",
    "Turkey": "Istanbul Ankara Izmir Bursa Antalya Konya",
    "Russia": "Moscow Saint_Petersburg Kazan Novosibirsk Yekaterinburg Samara Omsk Voronezh Murmansk Vladivostok Ufa Lipetsk",
    "Ukraine": "Kiev Kharkiv Odessa Lviv Dnipro",
    "Estonia": "Tallinn Tartu",
    "Latvia": "Riga",
    "Lithuania": "Vilnius Kaunas",
    "Georgia": "Tbilisi Batumi Kutaisi",
    "Armenia": "Yerevan Gyumri",
    "Azerbaijan": "Baku Ganja",
    "Israel": "Jerusalem Tel_Aviv Haifa Nazareth",
    "Jordan": "Amman Irbid",
    "Lebanon": "Beirut Tripoli Sidon",
    "Egypt": "Cairo Alexandria Giza Luxor Aswan",
    "Morocco": "Rabat Casablanca Marrakesh Fez Tangier",
    "Tunisia": "Tunis Sfax",
    "Iran": "Tehran Isfahan Shiraz Tabriz Mashhad Ahvaz",
    "Iraq": "Baghdad Basra Mosul Erbil Kufa",
    "Saudi Arabia": "Riyadh Jeddah Mecca Medina",
    "India": "Mumbai Delhi Chennai Kolkata Bangalore Hyderabad Pune Ahmedabad Jaipur Lucknow Kanpur Varanasi Kochi Kollam Mysore Amritsar Patna Bhopal Indore Nagpur Agra Gurgaon Madurai Coimbatore Thiruvananthapuram Chandigarh",
    "Pakistan": "Karachi Lahore Islamabad Peshawar Quetta Rawalpindi Chakwal",
    "Bangladesh": "Dhaka Chittagong Khulna",
    "Sri Lanka": "Colombo Kandy Galle",
    "Nepal": "Kathmandu Pokhara",
    "China": "Beijing Shanghai Guangzhou Shenzhen Nanjing Wuhan Chengdu Tianjin Hangzhou Xi'an Chongqing Harbin Lanzhou Suzhou Qingdao Kunming Taishan",
    "Taiwan": "Taipei Kaohsiung Taichung Tainan",
    "Japan": "Tokyo Osaka Kyoto Yokohama Nagoya Sapporo Kobe Fukuoka Hiroshima Sendai Nagano Nara",
    "South Korea": "Seoul Busan Incheon Daegu Gwangju Daejeon",
    "Vietnam": "Hanoi Saigon Haiphong Hue",
    "Thailand": "Bangkok Chiang_Mai Phuket",
    "Malaysia": "Kuala_Lumpur Penang Ipoh Kuching Malacca",
    "Singapore": "Singapore",
    "Indonesia": "Jakarta Surabaya Bandung Medan Yogyakarta",
    "Philippines": "Manila Cebu Davao Quezon_City",
    "Australia": "Sydney Melbourne Brisbane Perth Adelaide Canberra Hobart Darwin Geelong Newcastle",
    "Canada": "Toronto Montreal Vancouver Ottawa Calgary Edmonton Winnipeg Halifax Quebec_City Hamilton Kingston Victoria Regina Fredericton",
    "United States": "Chicago Boston Los_Angeles San_Francisco Seattle Philadelphia Atlanta Houston Dallas Denver Detroit Miami Baltimore Pittsburgh Cleveland Cincinnati Nashville Memphis Louisville Phoenix Portland Minneapolis Milwaukee Sacramento Austin Tucson Albuquerque Omaha Buffalo",
    "Mexico": "Mexico_City Guadalajara Monterrey Puebla Tijuana Acapulco Oaxaca",
    "Brazil": "São_Paulo Rio_de_Janeiro Brasília Salvador Recife Fortaleza Curitiba Manaus Belém",
    "Argentina": "Buenos_Aires Rosario Mendoza La_Plata Tucumán",
    "Chile": "Santiago Valparaíso Concepción",
    "Peru": "Lima Cusco Arequipa Trujillo",
    "Colombia": "Bogotá Medellín Cali Cartagena",
    "Venezuela": "Caracas Maracaibo Valencia_(Venezuela)",
    "Bolivia": "La_Paz Cochabamba Sucre",
    "Uruguay": "Montevideo",
    "Cuba": "Havana Santiago_de_Cuba",
    "Jamaica": "Kingston_(Jamaica) Montego_Bay",
    "South Africa": "Johannesburg Cape_Town Durban Pretoria Kimberley",
    "Nigeria": "Lagos Abuja Ibadan Kano",
    "Kenya": "Nairobi Mombasa Kisumu",
    "Ethiopia": "Addis_Ababa",
    "Ghana": "Accra Kumasi",
    "Uganda": "Kampala",
    "Zimbabwe": "Harare Bulawayo",
    "Senegal": "Dakar",
    "Syria": "Damascus Aleppo Homs",
    "Cyprus": "Nicosia Limassol",
    "Malta": "Valletta",
    "Luxembourg": "Luxembourg_City",
    "Kazakhstan": "Almaty Astana",
    "Uzbekistan": "Tashkent Samarkand",
    "Mongolia": "Ulaanbaatar",
    "Afghanistan": "Kabul Kandahar Herat",
    "Qatar": "Doha",
    "Kuwait": "Kuwait_City",
    "Oman": "Muscat",
    "Yemen": "Sanaa Aden",
    "Libya": "Benghazi",
    "Sudan": "Khartoum",
    "Montenegro": "Podgorica",
    "Belarus": "Minsk",
    "Ecuador": "Quito Guayaquil",
    "Panama": "Panama_City",
    "Cambodia": "Phnom_Penh",
    "Tanzania": "Dar_es_Salaam Dodoma",
}
# Countries that have no listed city are still values of country relations.
EXTRA_COUNTRIES = ["Scotland", "Wales", "England", "Paraguay", "Moldova", "Algeria",
                   "Bosnia and Herzegovina"]
LANGUAGES = """English French German Spanish Italian Portuguese Dutch Swedish Norwegian
Danish Finnish Polish Czech Hungarian Romanian Greek Turkish Russian Ukrainian Arabic
Hebrew Persian Hindi Bengali Tamil Telugu Kannada Malayalam Marathi Punjabi Urdu Japanese
Korean Mandarin Cantonese Vietnamese Thai Indonesian Malay Tagalog Swahili Amharic Georgian
Armenian Serbian Croatian Bulgarian Icelandic Estonian Latvian Lithuanian Irish Welsh
Catalan Basque Azerbaijani Assamese Albanian Slovak Slovene Yiddish Gujarati""".split()
OCCUPATIONS = """actor architect journalist nurse engineer teacher lawyer photographer
accountant pharmacist chef pilot economist librarian surgeon translator editor diplomat
banker carpenter electrician farmer historian novelist painter composer physicist chemist
biologist dentist veterinarian sculptor curator geologist mathematician musician
psychologist philosopher producer screenwriter judge police_officer civil_servant
software_developer nurse_practitioner museum_guide bus_driver""".split()
INDUSTRIES = """Logistics Foods Systems Textiles Pharma Energy Holdings Motors Insurance
Electronics Shipping Software Chemicals Breweries Robotics Analytics Construction Telecom
Retail Capital Optics Aerospace Mining Freight Ceramics Biotech""".split()
CLUB_SUFFIX = "Rovers Athletic Wanderers FC United City Albion Town".split()
PRODUCT_LINES = """Aero Pro Lite Max Air Go Flex One Mini Ultra Prime Edge Core Neo Pulse
Vista Terra Orbit Nova Sense Wave Spark Zen Halo""".split()
# Product kinds with a typical price in dollars.
PRODUCT_KINDS = dict(kettle=45, blender=90, e_bike=1900, headset=150, laptop=1200,
                     smartwatch=300, espresso_machine=550, drone=800, vacuum_cleaner=260,
                     air_purifier=220, camera=900, speaker=180, tablet=480, stroller=400,
                     treadmill=1300, router=120, monitor=350, toaster=40, scooter=650)
# Countries said with "the".
THE_COUNTRIES = {"Netherlands", "United Kingdom", "United States", "Czech Republic",
                 "Philippines"}
PLURAL_POSS = re.compile(r"\b(Industries|Holdings|Airlines|Motors|Rovers|Wanderers|Films|"
                         r"Pictures|Records|Studios|Systems|Foods|Textiles|Logistics|Chemicals|"
                         r"Breweries|Analytics|Electronics|Ceramics|Optics|Robotics)'s\b")

# --------------------------------------------------------------------------
# Relations. kind: subject type; val: value type; st: statement templates;
# q: question templates; p: "past" question templates. {o_a} = value with
# its indefinite article.

REL = {}


def rel(name, kind, val, dom, st, q, p=None, prob=1.0, over=True):
    REL[name] = dict(name=name, kind=kind, val=val, dom=dom, st=st, q=q, p=p or [],
                     prob=prob, over=over, many=False)


def many(name, kind, val, dom, st, q, prob):
    REL[name] = dict(name=name, kind=kind, val=val, dom=dom, st=st, q=q, p=[],
                     prob=prob, over=False, many=True)


rel("head_office_city", "company_h", "city", "organisation",
    ["The head office of {s} is in the city of {o}.", "{s} has its head office in {o}.",
     "{s}'s head office is located in {o}."],
    ["Where is {s}'s head office?", "Which city hosts the headquarters of {s}?"],
    ["What city was {s}'s head office in before it changed?",
     "Where did {s} have its head office previously?"])
rel("headquarters_country", "company_c", "country", "organisation",
    ["{s} is headquartered in {o}.", "The headquarters of {s} are in {o}."],
    ["In which country does {s} have its headquarters?",
     "What country is home to the main base of {s}?"],
    ["Which country were {s}'s headquarters in before they changed?",
     "Where was {s} headquartered previously?"])
rel("ceo", "company", "person", "organisation",
    ["The CEO of {s} is {o}.", "{o} is the chief executive of {s}.",
     "{s} is run by chief executive {o}."],
    ["Who is at the helm of {s} as CEO?", "Who heads {s}?"],
    ["Who was {s}'s CEO before the change?", "Who led {s} as chief executive previously?"],
    prob=0.8)
rel("board_chair", "company", "person", "organisation",
    ["{o} chairs the board of {s}.", "The chairman of {s} is {o}."],
    ["Who presides over the board of directors at {s}?", "Who is {s}'s board chairperson?"],
    ["Who chaired {s}'s board before the change?", "Who was chairman of {s} previously?"],
    prob=0.4)
rel("citizenship", "person", "country", "person",
    ["{s} is a citizen of {o}.", "{s} holds citizenship of {o}.",
     "{s} has the nationality of {o}."],
    ["Which country is {s} a national of?", "What is {s}'s country of citizenship?"],
    ["What citizenship did {s} hold before it changed?",
     "Which country was {s} a citizen of previously?"],
    prob=0.7)
rel("lives_in", "person", "city", "person",
    ["{s} lives in {o}.", "{s} resides in the city of {o}.", "{s}'s home is in {o}."],
    ["Where does {s} live?", "Which city is {s}'s place of residence?"],
    ["Where did {s} live before the change?", "Which city was {s}'s home previously?"],
    prob=0.8)
rel("employer", "person", "company_h", "person",
    ["{s} works for {o}.", "{s} is employed by {o}.", "{s}'s employer is {o}."],
    ["Which company employs {s}?", "At which company does {s} have a job?"],
    ["Which company did {s} work for before changing jobs?",
     "Who employed {s} previously?"],
    prob=0.7)
rel("spouse", "person", "spouse", "person",
    ["{s} is married to {o}.", "{s}'s spouse is {o}."],
    ["Who is {s}'s husband or wife?", "To whom is {s} wed?"],
    ["Who was {s} married to before?", "Who was {s}'s previous spouse?"],
    prob=0.4)
rel("occupation", "person", "occupation", "person",
    ["{s} works as {o_a}.", "{s}'s profession is {o}.", "By profession, {s} is {o_a}."],
    ["What does {s} do for a living?", "What is {s}'s line of work?"],
    ["What did {s} do for a living before the change?", "What was {s}'s job previously?"],
    prob=0.6)
rel("university", "person", "university", "person",
    ["{s} studies at {o}.", "{s} is enrolled at {o}."],
    ["Which university does {s} attend?", "Where is {s} a student?"],
    ["Which university did {s} attend before transferring?",
     "Where did {s} study previously?"],
    prob=0.2)
rel("family_doctor", "person", "person", "person",
    ["{s}'s family doctor is {o}.", "{s} is a patient of Dr. {o}."],
    ["Who is {s}'s GP?", "Which physician looks after {s}?"],
    ["Who was {s}'s family physician before the change?",
     "Which doctor treated {s} previously?"],
    prob=0.25)
rel("plays_for", "player", "team", "person",
    ["{s} plays for {o}.", "{s} is a player at {o}.", "{o} has {s} on its roster."],
    ["For which team does {s} compete?", "Which club fields {s}?"],
    ["Which team did {s} play for before the transfer?", "What club was {s} at previously?"])
rel("coach", "team", "person", "organisation",
    ["The head coach of {s} is {o}.", "{s} is coached by {o}.", "{o} coaches {s}."],
    ["Who is in charge of training {s}?", "Who manages {s} from the bench?"],
    ["Who coached {s} before the change?", "Who was {s}'s head coach previously?"])
rel("sponsor", "team", "company_h", "organisation",
    ["The main sponsor of {s} is {o}.", "{s} is sponsored by {o}."],
    ["Whose logo is on {s}'s shirts?", "Which company backs {s} financially?"],
    ["Which company sponsored {s} before the change?",
     "Who was {s}'s main sponsor previously?"],
    prob=0.6)
rel("director", "film", "person", "creative_work",
    ["{s} was directed by {o}.", "The director of {s} is {o}.", "{o} directed {s}."],
    ["Who is the filmmaker behind {s}?", "Who helmed the film {s}?"],
    ["Who was credited as director of {s} before the change?",
     "Who was listed as {s}'s director previously?"])
rel("film_language", "film", "language", "creative_work",
    ["The language of {s} is {o}.", "{s} is a {o}-language film."],
    ["In what language is {s}?", "Which language do the characters of {s} speak?"],
    ["What language was {s} in before it changed?",
     "Which language was {s} listed in previously?"],
    prob=0.8)
rel("distributor", "film", "studio", "creative_work",
    ["{s} is distributed by {o}.", "The distributor of {s} is {o}."],
    ["Which company handles distribution of {s}?", "Who releases {s} to cinemas?"],
    ["Who distributed {s} before the change?",
     "Which company was {s}'s distributor previously?"],
    prob=0.5)
rel("record_label", "band", "label", "creative_work",
    ["{s} is signed to {o}.", "{s} releases records on {o}.",
     "The record label of {s} is {o}."],
    ["Which label has {s} under contract?", "What record company puts out music by {s}?"],
    ["Which label was {s} signed to before the change?",
     "What was {s}'s record company previously?"])
rel("lead_singer", "band", "person", "creative_work",
    ["The lead singer of {s} is {o}.", "{o} sings lead vocals in {s}."],
    ["Who fronts {s}?", "Who is the vocalist of {s}?"],
    ["Who fronted {s} before the change?", "Who was {s}'s singer previously?"],
    prob=0.7)
rel("city_country", "city", "country_of_city", "place",
    ["{s} is located in {o}.", "{s} is a city in {o}."],
    ["Which country is {s} in?", "In what country can one find {s}?"],
    over=False)
rel("mayor", "city", "person", "place",
    ["The mayor of {s} is {o}.", "{o} is the mayor of {s}.", "{s} is governed by mayor {o}."],
    ["Who runs the city government of {s}?", "Who holds the mayoralty of {s}?"],
    ["Who was mayor of {s} before the change?", "Who led {s}'s city hall previously?"],
    prob=0.6)
rel("region_capital", "region", "city", "place",
    ["The capital of {s} is {o}.", "{o} is the capital of {s}."],
    ["Which city is the seat of government of {s}?",
     "Where is the administrative centre of {s}?"],
    ["Which city was the capital of {s} before the change?",
     "Where was {s}'s seat of government previously?"])
rel("governor", "region", "person", "place",
    ["The governor of {s} is {o}.", "{o} serves as governor of {s}."],
    ["Who leads {s} as governor?", "Who is the head of the regional government of {s}?"],
    ["Who was governor of {s} before the change?", "Who governed {s} previously?"],
    prob=0.6)
rel("price", "product", "price", "product",
    ["The price of {s} is {o}.", "{s} retails at {o}.", "{s} sells for {o}."],
    ["How much does {s} cost?", "What does one pay for {s}?"],
    ["What did {s} cost before the price changed?", "What was the price of {s} previously?"])
rel("manufacturer", "product", "company_h", "product",
    ["{s} is made by {o}.", "{s} is manufactured by {o}.", "The maker of {s} is {o}."],
    ["Which company produces {s}?", "Who builds {s}?"],
    ["Which company made {s} before the change?", "Who manufactured {s} previously?"],
    prob=0.7)
rel("factory_city", "product", "city", "product",
    ["{s} is assembled in {o}.", "{s} is produced in a factory in {o}."],
    ["In which city is {s} made?", "Where does {s} come off the production line?"],
    ["Where was {s} assembled before the change?",
     "In which city was {s} produced previously?"],
    prob=0.5)
rel("brand_owner", "brand", "company_h", "product",
    ["{s} is owned by {o}.", "The owner of the brand {s} is {o}.", "{o} owns the {s} brand."],
    ["Which company holds the rights to the {s} brand?", "To whom does the brand {s} belong?"],
    ["Who owned {s} before the change?", "Which company held the {s} brand previously?"])
many("has_child", "person", "child", "person",
     ["{s} has a child named {o}.", "{o} is a child of {s}."],
     ["Who are {s}'s children?", "Name the kids of {s}."], prob=0.12)
many("member_of", "person", "org", "person",
     ["{s} is a member of {o}.", "{s} belongs to {o}."],
     ["Which organisations count {s} among their members?", "What groups has {s} joined?"],
     prob=0.12)
many("speaks", "person", "language", "person",
     ["{s} speaks {o}.", "{s} is fluent in {o}."],
     ["Which languages does {s} know?", "In what languages can {s} hold a conversation?"],
     prob=0.12)
many("has_visited", "person", "place", "person",
     ["{s} has visited {o}.", "{s} has been to {o}."],
     ["Which places has {s} travelled to?", "Where has {s} been on trips?"], prob=0.12)

# Chains: relations along the path (each value is the next subject) and
# two question templates.
CHAINS = [
    (["head_office_city", "city_country"],
     ["In which country is the city where {s}'s head office is?",
      "{s}'s head office lies in a city of which country?"]),
    (["lives_in", "city_country"],
     ["In which country is the city where {s} lives?",
      "Which country is {s}'s home city part of?"]),
    (["employer", "head_office_city"],
     ["In which city does {s}'s employer have its head office?",
      "Where is the head office of the company {s} works for?"]),
    (["plays_for", "coach"],
     ["Who coaches the team {s} plays for?", "Who is the head coach of {s}'s team?"]),
    (["brand_owner", "head_office_city", "city_country"],
     ["In which country is the head office of the company that owns {s}?",
      "The owner of {s} has its head office in which country?"]),
    (["head_office_city", "mayor"],
     ["Who is the mayor of the city where {s} has its head office?",
      "Who runs the city that hosts {s}'s head office?"]),
    (["manufacturer", "head_office_city"],
     ["In which city is the head office of the company that makes {s}?",
      "Where is the maker of {s} headquartered?"]),
    (["spouse", "employer", "head_office_city", "city_country"],
     ["In which country is the head office of the company {s}'s spouse works for?",
      "{s}'s spouse works for a company headquartered in which country?"]),
    (["director", "citizenship"],
     ["What is the citizenship of the person who directed {s}?",
      "Which country is the director of {s} a citizen of?"]),
]

# Subject types: relative count (per ~19,000 statements) and whether the
# pool may be capped by what the data gives.
KINDS = dict(company_h=600, company_c=150, person=1800, player=300, team=80, film=600,
             band=200, city=230, region=150, product=400, brand=200)

# --------------------------------------------------------------------------
# Harvesting names.

WORD = r"[A-Z][a-zà-öø-ÿāăąćčďēėęěğīįıķłńňōőœřśşšţťūůűųźżžß'\-]+"
JUNK_FIRST = set("""The A An At In Its After And Of Or For To On By With As From This That These
Those Co Co. E. Under Similarly Location Country Central National General Royal Eastern Western
Northern Southern Senior Arts Catholic Autonomous Free Creative Administrative Executive
Legislative Consultative Government International Indian British American African European
Capital Code Congressional Ecclesiastical Anglican Military Public Old Third First Second
Several Many Some Most All His Her Their Our My Your Dance Hot High Graduate Historical
Location Computer Intelligence Defence Composite Americas Country Scotland England Barclays
Coutts Jaguar Mount Its When Where While Although During Both Each Every Other Another Such
Australia Berry's Domestic Criminology Croquet Jolly Altar Bones Dorothy General Individual
Important Ghost Chinese Indian Hong Kong USCF Lockyer Halifax South North East West Upper Lower
""".split())
JUNK_ANY = set("""Country Year Thursday Southeast Southeastern Northeast Northeastern Midwestern
Midwest Southwest Southwestern Northwest Northwestern Amateur Parent Assistant Youth Robot
Techniques Panafrican Asian Short Kingsway Computer Capitals Land Rover Les""".split())
TITLES = set("""Lord Lady Sir King Queen Prince Princess Saint St. Pope Count Countess Duke
Duchess Emperor Empress General Captain President Baron Earl Bishop Dr. Mr. Mrs.""".split())
BAD_NAMES = {"World Records", "Guinness World Records", "Hindi Films", "Real Records",
             "Recommended Records", "Tre Publishing", "Hoare & Co England United",
             "Sexual Encounter Group", "Patti Smith Group", "Lou Man Group", "Sorrow Company",
             "Amy Steel", "Bank Holding Company", "Thailand Public Company",
             "Thrissur Municipal Corporation", "Girls' Public Day School Company",
             "Millennium Challenge Corporation", "Air One Nine Company", "Mvp Holdings",
             "Native Hawaiian Legal Corporation", "Saskatchewan Gaming Corporation",
             "Jai Al-", "W. S. Van", "Hamilton Mac", "William D. Mac", "Dominique You",
             "Gregory George Teu"}
PROFANE = {"fuck you", "netflix", "live", "stephen", "super hits"}


def load():
    w = json.load(open(DATA + "2wikimultihopqa_corpus.json"))
    mu = json.load(open(DATA + "musique_train_corpus.json"))
    oie = json.load(open(DATA + "openie_musique_train_results_ner_gpt-3.5-turbo-1106_1890.json"))["docs"]
    hp = json.load(open(DATA + "hotpotqa_train_corpus.json"))
    texts = [p["text"] for p in w] + [p["text"] for p in mu]
    texts += [" ".join(hp[k]) for k in sorted(hp)]
    return w, mu, oie, hp, texts


def strip_paren(t):
    return re.sub(r"\s*\([^)]*\)\s*$", "", t).strip()


def clean_name(n):
    n = re.sub(r"\s+", " ", n.replace("\u00a0", " ")).strip(" ,.;:")
    return n


def ok_name(n, max_words=5):
    if not n or not n[0].isupper() or BANNED.search(n):
        return False
    if any(c in n for c in '{}[]"|/\\;?!()') or ".." in n or "- " in n:
        return False
    ws = n.split()
    return 1 <= len(ws) <= max_words


def harvest(rng):
    w, mu, oie, hp, texts = load()
    alltext = "\n".join(texts)
    lower_tokens = set(re.findall(r"\b[a-zà-ÿ][a-zà-ÿ'\-]+\b", alltext))

    def present(name):
        return re.search(r"(?<![\w\-])" + re.escape(name) + r"(?![\w\-])", alltext) is not None

    pools = {}
    # Countries and cities (fixed lists, kept where they occur).
    city_country = {}
    for country in sorted(CITIES):
        for c in CITIES[country].split():
            c = c.replace("_", " ")
            c = re.sub(r"\s*\(.*\)$", "", c)
            if c in city_country or BANNED.search(c) or not present(c):
                continue
            city_country[c] = country
    countries = sorted(set(city_country.values()) | set(EXTRA_COUNTRIES))
    countries = [c for c in countries if present(c) or c == "United Kingdom"
                 or c == "United States"]
    pools["city"] = sorted(city_country)
    pools["country"] = countries
    pools["language"] = [l for l in LANGUAGES if present(l)]
    pools["occupation"] = [o.replace("_", " ") for o in OCCUPATIONS
                           if present(o.replace("_", " "))]

    person_rx = re.compile(r"^(%s|[A-Z]\.)( (%s|[A-Z]\.)){1,2}$" % (WORD, WORD))

    def person_ok(n):
        if not person_rx.match(n) or BANNED.search(n):
            return False
        toks = n.split()
        if any(t in JUNK_FIRST or t in TITLES for t in toks):
            return False
        if n in BAD_NAMES or toks[-1].endswith((".", "-")) or "- " in n or any(len(t) < 3 and not t.endswith(".") for t in toks):
            return False
        return True

    persons = []
    # 2Wiki biographies: "Name (born ...) was/is a ..."
    for p in w:
        t = p["text"][:250]
        if re.match(r"^[^.(]{2,60}\((born|died|c\.|\d{1,2} \w+ \d{4}|\w+ \d{1,2}, \d{4}|\d{4})", t) \
                and re.search(r"\b(was|is) an? ", t):
            persons.append(clean_name(strip_paren(p["title"])))
    for t in texts:
        for m in re.finditer(r"directed by ((?:%s|[A-Z]\.)(?: (?:%s|[A-Z]\.)){1,2})" % (WORD, WORD), t):
            persons.append(clean_name(m.group(1)))
    person_preds = {"born on", "born in", "was born on", "was born in", "died on", "died in",
                    "married", "married to", "son of", "daughter of", "wife of", "husband of"}
    for d in oie:
        for tr in d["extracted_triples"]:
            if len(tr) == 3 and isinstance(tr[0], str) and tr[1].lower() in person_preds:
                persons.append(clean_name(tr[0]))
    persons = sorted(set(n for n in persons if person_ok(n)))

    # Films: 2Wiki "X is a 1995 ... film".
    films = []
    for p in w:
        if re.search(r"\b(is|was) an? \d{4} ([A-Za-z\-]+ ){0,4}film\b(?! (director|producer|editor|composer|actor|critic))",
                     p["text"][:250]):
            films.append(clean_name(strip_paren(p["title"])))
    films = sorted(set(f for f in films if ok_name(f, 6) and f not in persons and ":" not in f))

    # Bands: short song/album/band titles and film-like titles (those not used as films).
    bandc = []
    for p in w:
        m = re.search(r"\((?:[^)]*\b)?(song|album|band|single|EP)\)$", p["title"])
        if m:
            bandc.append(clean_name(strip_paren(p["title"])))
    bandc = sorted(set(b for b in bandc if ok_name(b, 3) and not re.search(r"\d", b)
                       and b.lower() not in PROFANE))

    def suffixed(sufs, max_before=4, common_ok=False):
        """Names ending in one of sufs, taken whole (a match that starts
        inside a longer capitalised run is dropped)."""
        out = set()
        rx = re.compile(r"((?:%s|&) ){1,%d}(?:%s)\b" % (WORD, max_before, "|".join(sufs)))
        srcs = texts + [e for d in oie for e in d["extracted_entities"] if isinstance(e, str)]
        for t in srcs:
            for m in rx.finditer(t):
                before = t[:m.start()].rstrip()
                if re.search(r"(%s|&|[A-Z]\.?)$" % WORD, before) and m.start() > 0 \
                        and not before.endswith((".", ",", ";", ":")):
                    continue  # part of a longer name
                n = clean_name(m.group(0))
                toks = n.split()
                if len(toks) < 2 or toks[0] in JUNK_FIRST or "&" in (toks[0], toks[-2]):
                    continue
                if n in BAD_NAMES or BANNED.search(n) or "'s" in n or "- " in n or n.endswith("-"):
                    continue
                if any(t in JUNK_ANY for t in toks):
                    continue
                if not common_ok and len(toks) == 2 and toks[0].lower() in lower_tokens:
                    continue  # "Parent Company", "Home Entertainment"
                out.add(n)
        return sorted(out)

    companies = suffixed(["Company", "Corporation", "Group", "Airlines", "Bank", "Motors",
                          "Holdings", "Industries", "Publishing", "Electric", "Railway",
                          "Brewery", "Steel", "Insurance", "Manufacturing"])
    studios = suffixed(["Pictures", "Films", "Film Company", "Film Corporation",
                        "Releasing Corporation", "Distributing Corporation"])
    labels = suffixed(["Records"], common_ok=True)
    teams = suffixed(["FC", "United", "Football Club", "Rovers", "Wanderers", "Athletic"])
    unis = set(suffixed(["University"]))
    for t in texts:
        for m in re.finditer(r"University of (%s)(?: (%s))?" % (WORD, WORD), t):
            n = clean_name(m.group(0))
            if not BANNED.search(n) and not n.endswith("-") and "Capitals" not in n:
                unis.add(n)
    unis = sorted(unis)
    orgs = suffixed(["Society", "Association", "Academy", "Federation", "Institute", "Club"])
    orgs = [o for o in orgs if o not in teams and not o.startswith("Russian ")]
    regions = suffixed(["Province", "Region", "Oblast", "Prefecture", "County", "Voivodeship"], 2)

    # Brands: surnames of harvested people (Bosch, Braun, ...), one word,
    # never seen in lower case; people with such a surname leave the
    # person pool so that a brand never reads as someone's name.
    taken_tokens = set()
    for pool in (films, companies, studios, labels, teams, unis, orgs, regions,
                 pools["city"], pools["country"], pools["language"]):
        for n in pool:
            taken_tokens.update(n.split())
    firsts = set(n.split()[0] for n in persons)
    surn = sorted(set(n.split()[-1] for n in persons))
    surn = [x for x in surn if re.fullmatch(r"[A-Z][a-z]{3,9}", x) and x.lower() not in lower_tokens
            and x not in taken_tokens and x not in firsts and not BANNED.search(x)]
    random.Random(SEED).shuffle(surn)
    brands = sorted(surn[:len(surn) * 2 // 5])
    bset = set(brands)
    persons = [n for n in persons if n.split()[-1] not in bset]
    pools["_brand_surnames"] = bset

    # Deduplicate across pools (a name belongs to one pool only).
    seen = set(pools["city"]) | set(pools["country"]) | set(pools["language"])
    def dedupe(lst):
        out = []
        for n in lst:
            if n not in seen:
                seen.add(n)
                out.append(n)
        return out
    pools["person"] = dedupe(persons)
    pools["film"] = dedupe(films)
    pools["company"] = dedupe(companies)
    pools["studio"] = dedupe(studios)
    pools["label"] = dedupe(labels)
    pools["team"] = dedupe(teams)
    pools["university"] = dedupe(unis)
    pools["org"] = dedupe(orgs)
    pools["region"] = dedupe(regions)
    pools["band"] = dedupe(bandc)
    pools["brand"] = dedupe(brands)
    pools["_seen"] = seen
    return pools, city_country


# --------------------------------------------------------------------------
# World: subjects of each type, facts with versions.

def article(o):
    return ("an " if o[0].lower() in "aeiou" else "a ") + o


def cap(text):
    return text[:1].upper() + text[1:]


def fill(tpl, s, o=""):
    o = "the " + o if o in THE_COUNTRIES else o
    text = tpl.format(s=s, o=o, o_a=article(o) if o else "")
    return cap(PLURAL_POSS.sub(lambda m: m.group(1) + "'", text))


def render(tpl, s, o):
    return fill(tpl, s, o)


def kind_rels(kind):
    """Relations a subject of this type can get (in REL order)."""
    return [r for r in REL.values()
            if r["kind"] == kind or (r["kind"] == "company" and kind.startswith("company"))
            or (r["kind"] == "person" and kind == "player"
                and r["name"] in ("citizenship", "lives_in"))]


class World:
    def __init__(self, pools, city_country, scale, rng):
        self.rng = rng
        self.city_country = city_country
        self.seen = set(pools["_seen"])
        P = {k: list(v) for k, v in pools.items() if not k.startswith("_")}
        for k in P:
            rng.shuffle(P[k])
        self.P = P
        n = {k: max(3, round(v * scale)) for k, v in KINDS.items()}
        n["city"] = min(len(P["city"]), max(20, round(KINDS["city"] * min(1.0, scale * 4))))
        self.n = n
        # Parts for composed names: plain first names and surnames of 4+
        # letters that are not also first names.
        firsts = sorted(set(x.split()[0] for x in P["person"]
                            if re.fullmatch(WORD, x.split()[0]) and len(x.split()[0]) >= 3))
        lasts = sorted(set(x.split()[-1] for x in P["person"]
                           if re.fullmatch(WORD, x.split()[-1]) and len(x.split()[-1]) >= 4)
                       - set(firsts))
        self.firsts, self.lasts = firsts, lasts
        # Subjects.
        self.subj = {}
        self.subj["city"] = P["city"][:n["city"]]
        comps = self.take_or_make(P["company"], n["company_h"] + n["company_c"],
                                  lambda: f"{rng.choice(lasts)} {rng.choice(INDUSTRIES)}")
        self.subj["company_h"] = comps[:n["company_h"]]
        self.subj["company_c"] = comps[n["company_h"]:]
        people = self.take_or_make(P["person"], n["person"] + n["player"] + n["person"] // 2,
                                   lambda: f"{rng.choice(firsts)} {rng.choice(lasts)}")
        self.subj["person"] = people[:n["person"]]
        self.subj["player"] = people[n["person"]:n["person"] + n["player"]]
        self.extra_people = people[n["person"] + n["player"]:]
        cities = self.subj["city"]
        self.subj["team"] = self.take_or_make(
            P["team"], n["team"], lambda: f"{rng.choice(cities)} {rng.choice(CLUB_SUFFIX)}")
        self.subj["film"] = self.take_or_make(P["film"], n["film"], None)
        bandpool = P["film"][n["film"]:] + P["band"]
        bandpool = [b for b in bandpool if len(b.split()) <= 3 and not re.search(r"\d", b)]
        self.subj["band"] = self.take_or_make(bandpool, n["band"], None)
        self.subj["region"] = self.take_or_make(P["region"], n["region"], None)
        self.subj["brand"] = self.take_or_make(P["brand"], n["brand"], None)
        prodwords = P["brand"][n["brand"]:] or P["brand"]
        kinds = sorted(PRODUCT_KINDS)
        self.subj["product"] = self.take_or_make(
            [], n["product"],
            lambda: f"the {rng.choice(prodwords)} {rng.choice(PRODUCT_LINES)} "
                    f"{rng.choice([100, 200, 300, 400, 500, 700, 900, 2, 3, 5, 7, 9, 12, 20, 45])} "
                    f"{rng.choice(kinds)}".replace("_", " ").replace("e bike", "e-bike"))
        self.subj["company"] = self.subj["company_h"] + self.subj["company_c"]
        # Value pools.
        self.vals = {
            "city": self.subj["city"],
            "country": P["country"],
            "country_of_city": None,
            "company_h": self.subj["company_h"],
            "person": self.subj["person"] + self.extra_people,
            "occupation": P["occupation"],
            "university": self.take_or_make(P["university"], max(8, n["person"] // 20), None),
            "team": self.subj["team"],
            "studio": self.take_or_make(P["studio"], max(8, n["film"] // 8), None),
            "language": P["language"],
            "label": self.take_or_make(P["label"], max(8, n["band"] // 3),
                                       lambda: f"{rng.choice(prodwords)} Records"),
            "org": self.take_or_make(P["org"], max(10, n["person"] // 15), None),
        }
        self.vals["place"] = self.vals["city"] + self.vals["country"]
        self.facts = []  # dict(rel, s, tpl, values)
        self.build()

    def take_or_make(self, pool, k, make):
        out = list(pool[:k])
        tries = 0
        while len(out) < k and make is not None and tries < 100000:
            tries += 1
            x = make()
            if x in self.seen or BANNED.search(x):
                continue
            self.seen.add(x)
            out.append(x)
        return out

    def draw(self, r, s, exclude):
        rng = self.rng
        v = r["val"]
        if v == "country_of_city":
            return self.city_country[s]
        if v == "price":
            base = exclude[-1] if exclude else None
            for _ in range(50):
                if base:
                    x = float(base.replace("$", "").replace(",", "")) * rng.uniform(0.7, 1.35)
                else:
                    kind = s.split()[-1] if not s.endswith(("machine", "cleaner", "purifier")) \
                        else "_".join(s.split()[-2:])
                    x = PRODUCT_KINDS[kind.replace("-", "_")] * rng.uniform(0.6, 1.6)
                x = max(5, round(x / 5) * 5 - (1 if rng.random() < 0.5 else 0))
                p = f"${x:,}"
                if p not in exclude:
                    return p
            return None
        if v == "spouse":
            for _ in range(200):
                o = rng.choice(self.spouse_pool)
                if o not in self.used_spouse and o != s:
                    self.used_spouse.add(o)
                    return o
            return None
        if v == "child":
            last = s.split()[-1]
            for _ in range(50):
                o = f"{rng.choice(self.firsts)} {last}"
                if o not in self.seen and o not in exclude and not BANNED.search(o):
                    self.seen.add(o)
                    return o
            return None
        pool = self.vals[v]
        for _ in range(100):
            o = rng.choice(pool)
            if o != s and o not in exclude:
                return o
        return None

    def build(self):
        rng = self.rng
        spouse_havers = set(x for x in self.subj["person"] if rng.random() < REL["spouse"]["prob"])
        self.spouse_pool = [x for x in self.vals["person"] if x not in spouse_havers]
        self.used_spouse = set()
        for kind in ["company_h", "company_c", "person", "player", "team", "film", "band",
                     "city", "region", "product", "brand"]:
            rels = kind_rels(kind)
            for s in self.subj[kind]:
                for r in rels:
                    prob = r["prob"]
                    if kind == "player" and r["name"] != "plays_for":
                        prob *= 0.6
                    if r["name"] == "spouse":
                        if s not in spouse_havers:
                            continue
                    elif rng.random() >= prob:
                        continue
                    if r["many"]:
                        k = rng.choice([2, 2, 3])
                    elif r["over"]:
                        u = rng.random()
                        k = 3 if u < 0.07 else 2 if u < 0.36 else 1
                    else:
                        k = 1
                    vals = []
                    for _ in range(k):
                        o = self.draw(r, s, vals)
                        if o is None:
                            break
                        vals.append(o)
                    if not vals or (r["many"] and len(vals) < 2):
                        continue
                    self.facts.append(dict(rel=r["name"], s=s, tpl=rng.choice(r["st"]),
                                           vals=vals, dom=r["dom"]))
        self.index = {(f["s"], f["rel"]): f for f in self.facts}

    def n_statements(self):
        return sum(len(f["vals"]) for f in self.facts)


# --------------------------------------------------------------------------
# Questions.

def pick_questions(world, rng):
    F, idx = world.facts, world.index
    used = set()  # facts already asked about (by object identity)
    qs = []

    def by_rel(pred):
        d = defaultdict(list)
        for i, f in enumerate(F):
            if pred(f) and i not in used:
                d[f["rel"]].append(i)
        return d

    def round_robin(d, k):
        rels = sorted(d)
        rng.shuffle(rels)
        for r in rels:
            rng.shuffle(d[r])
        out = []
        while len(out) < k and any(d[r] for r in rels):
            for r in rels:
                if d[r] and len(out) < k:
                    out.append(d[r].pop())
        return out

    # Chains first (they need the rarest combinations).
    cands = defaultdict(list)
    for ci, (path, _) in enumerate(CHAINS):
        for i, f in enumerate(F):
            if f["rel"] != path[0]:
                continue
            hops = [f]
            ok = True
            for r in path[1:]:
                nxt = idx.get((hops[-1]["vals"][-1], r))
                if nxt is None:
                    ok = False
                    break
                hops.append(nxt)
            if not ok:
                continue
            mid_over = any(len(h["vals"]) > 1 for h in hops[:-1])
            # The next fact about each old intermediate value.
            old_next = []
            for j, h in enumerate(hops[:-1]):
                for ov in h["vals"][:-1]:
                    g = idx.get((ov, path[j + 1]))
                    if g is not None and g is not hops[j + 1]:
                        old_next.append(g)
            differs = any(g["vals"][-1] != hops[-1]["vals"][-1] for g in old_next
                          if g["rel"] == path[-1])
            score = (2 if mid_over else 0) + (1 if old_next else 0) + (1 if differs else 0)
            cands[ci].append((score, i, hops, old_next))
    chains = []
    order = list(range(len(CHAINS)))
    rng.shuffle(order)
    for ci in order:
        rng.shuffle(cands[ci])
        cands[ci].sort(key=lambda c: -c[0])
    asked_subj = set()
    chain_facts = set()
    while len(chains) < N_QUESTIONS["chain"] and any(cands[ci] for ci in order):
        for ci in order:
            while cands[ci] and len(chains) < N_QUESTIONS["chain"]:
                score, i, hops, old_next = cands[ci].pop(0)
                if hops[0]["s"] in asked_subj or any(id(h) in chain_facts for h in hops):
                    continue
                asked_subj.add(hops[0]["s"])
                chain_facts.update(id(h) for h in hops)
                chains.append((ci, hops, old_next))
                break
    for ci, hops, old_next in chains:
        path, tpls = CHAINS[ci]
        qs.append(dict(kind="chain", tpl=rng.choice(tpls), s=hops[0]["s"], hops=hops,
                       old_next=old_next, rel=">".join(path), rels=path,
                       dom=hops[0]["dom"]))

    # Past: facts overridden exactly once.
    d = by_rel(lambda f: REL[f["rel"]]["over"] and len(f["vals"]) == 2
               and f["s"] not in asked_subj)
    for i in round_robin(d, N_QUESTIONS["past"]):
        used.add(i)
        qs.append(dict(kind="past", fact=F[i], tpl=rng.choice(REL[F[i]["rel"]]["p"])))
    # Current, overridden.
    d = by_rel(lambda f: not REL[f["rel"]]["many"] and len(f["vals"]) > 1)
    for i in round_robin(d, N_QUESTIONS["current_over"]):
        used.add(i)
        qs.append(dict(kind="current", fact=F[i], tpl=rng.choice(REL[F[i]["rel"]]["q"])))
    # Current, never overridden.
    d = by_rel(lambda f: not REL[f["rel"]]["many"] and len(f["vals"]) == 1)
    for i in round_robin(d, N_QUESTIONS["current_plain"]):
        used.add(i)
        qs.append(dict(kind="current", fact=F[i], tpl=rng.choice(REL[F[i]["rel"]]["q"])))
    # Many.
    d = by_rel(lambda f: REL[f["rel"]]["many"])
    for i in round_robin(d, N_QUESTIONS["many"]):
        used.add(i)
        qs.append(dict(kind="many", fact=F[i], tpl=rng.choice(REL[F[i]["rel"]]["q"])))
    return qs


def protected_facts(qs):
    out = set()
    for q in qs:
        if q["kind"] == "chain":
            out.update(id(h) for h in q["hops"])
            out.update(id(g) for g in q["old_next"])
        else:
            out.add(id(q["fact"]))
    return out


def absent_questions(world, facts, ids, qs, target):
    """N_ABSENT questions about a known subject (2+ statements with it as
    subject) for a relation it could have by type but never has in the
    stream; gold, stale, also and path are empty. Drawn from an RNG of their
    own, made after everything else, so memories and the other questions do
    not change. A person or player who is the value of any statement ("the
    CEO of X is P", "A is married to P") is never asked: the stream would
    hint at the answer. One subject per 1/N_ABSENT slice of the stream (by
    the mean position of its statements; the nearest free subject when a
    slice has none), relations balanced, subjects of the other questions
    avoided where possible."""
    rng = random.Random(f"{SEED}-absent-{target}")
    kind_of = {s: k for k, subs in sorted(world.subj.items()) if k != "company" for s in subs}
    pos = defaultdict(list)  # subject -> positions of its statements
    has = defaultdict(set)  # subject -> relations it has in the stream
    as_value = set()
    for f in facts:
        has[f["s"]].add(f["rel"])
        for vi, v in enumerate(f["vals"]):
            pos[f["s"]].append(int(ids[(id(f), vi)][1:]))
            as_value.add(v)
    asked = set()
    for q in qs:
        asked.add(q["s"] if q["kind"] == "chain" else q["fact"]["s"])
    cands = defaultdict(list)  # subject -> relations it could be asked
    for s in sorted(pos):
        if len(pos[s]) < 2:
            continue
        kind = kind_of[s]
        if kind in ("person", "player") and s in as_value:
            continue
        for r in kind_rels(kind):
            if not r["many"] and r["over"] and r["name"] not in has[s]:
                cands[s].append(r["name"])
    key = {s: sum(pos[s]) / len(pos[s]) for s in cands}
    subjects = sorted(cands)
    rng.shuffle(subjects)
    width = target / N_ABSENT
    used_rel = Counter()
    out = []
    for b in range(N_ABSENT):
        lo, hi = b * width, (b + 1) * width
        free = [s for s in subjects if s not in {q["s"] for q in out}]
        assert free, "too few subjects for absent questions"
        here = [s for s in free if lo <= key[s] < hi]
        if not here:
            mid = (lo + hi) / 2
            d = min(abs(key[s] - mid) for s in free)
            here = [s for s in free if abs(key[s] - mid) == d]
        pairs = [(used_rel[r], s in asked, rng.random(), s, r) for s in here for r in cands[s]]
        _, _, _, s, r = min(pairs)
        used_rel[r] += 1
        out.append(dict(s=s, rel=r))
    res = []
    for q in out:
        s, r = q["s"], REL[q["rel"]]
        assert len(pos[s]) >= 2 and r["name"] not in has[s] and not r["many"]
        assert not (kind_of[s] in ("person", "player") and s in as_value)
        res.append(dict(text=fill(rng.choice(r["q"]), s), kind="absent", gold=[], stale=[],
                        also=[], path=[], relation=r["name"], domain=r["dom"]))
    rng.shuffle(res)
    return res


# --------------------------------------------------------------------------

def build_stream(pools, city_country, target):
    # Find a scale that gives a few percent more statements than the target.
    scale = target / 19000
    for _ in range(8):
        w = World(pools, city_country, scale, random.Random(SEED + target))
        n = w.n_statements()
        want = target * 1.04 + 20
        if want <= n <= target * 1.10 + 40:
            break
        scale *= want / n
    rng = random.Random(SEED + target + 1)
    qs = pick_questions(w, rng)
    # Trim unasked facts at random until the count is exact.
    prot = protected_facts(qs)
    excess = w.n_statements() - target
    assert excess >= 0, (target, w.n_statements())
    order = list(range(len(w.facts)))
    rng.shuffle(order)
    drop = set()
    for i in order:
        f = w.facts[i]
        if excess == 0:
            break
        if id(f) in prot or len(f["vals"]) > excess:
            continue
        # Keep what a kept chain-able fact points at: never drop city_country or
        # head_office_city (intermediate values stay subjects of the next relation).
        if f["rel"] in ("city_country", "head_office_city", "coach"):
            continue
        drop.add(i)
        excess -= len(f["vals"])
    assert excess == 0
    facts = [f for i, f in enumerate(w.facts) if i not in drop]

    # Positions: sorted uniform keys per fact, then one global order.
    events = []
    for fi, f in enumerate(facts):
        keys = sorted(rng.random() for _ in f["vals"])
        for vi, k in enumerate(keys):
            events.append((k, fi, vi))
    events.sort()
    ids = {}
    mems = []
    for pos, (_, fi, vi) in enumerate(events):
        f = facts[fi]
        mid = f"s{pos:06d}"
        ids[(id(f), vi)] = mid
        h, m = divmod(pos, 60)
        day, h = divmod(h, 24)
        ts = f"2024-01-{1 + day:02d}T{h:02d}:{m:02d}:00Z"
        mems.append(dict(id=mid, content=render(f["tpl"], f["s"], f["vals"][vi]),
                         event_time=ts, memory_type="semantic"))
    assert len(mems) == target

    def vid(f, vi):
        return ids[(id(f), vi % len(f["vals"]))]

    def allv(f):
        return [vid(f, i) for i in range(len(f["vals"]))]

    out_q = []
    for q in qs:
        if q["kind"] == "chain":
            hops = q["hops"]
            gold = [vid(hops[-1], -1)]
            path = [vid(h, -1) for h in hops]
            stale = []
            for h in hops:
                stale += allv(h)[:-1]
            for g in q["old_next"]:
                stale.append(vid(g, -1))
            stale = [x for x in dict.fromkeys(stale) if x not in path]
            out_q.append(dict(text=fill(q["tpl"], q["s"]), kind="chain", gold=gold,
                              stale=stale, also=[], path=path, relation=q["rel"],
                              domain=q["dom"], relations=q["rels"]))
            continue
        f = q["fact"]
        text = fill(q["tpl"], f["s"])
        base = dict(relation=f["rel"], domain=f["dom"])
        if q["kind"] == "current":
            out_q.append(dict(text=text, kind="current", gold=[vid(f, -1)],
                              stale=allv(f)[:-1], also=[], path=[], **base))
        elif q["kind"] == "past":
            out_q.append(dict(text=text, kind="past", gold=[vid(f, 0)], stale=[],
                              also=[vid(f, -1)], path=[], **base))
        else:
            out_q.append(dict(text=text, kind="many", gold=allv(f), stale=[], also=[],
                              path=[], **base))
    rng.shuffle(out_q)
    single = [f for f in facts if REL[f["rel"]]["over"]]
    stats = dict(
        facts=len(facts),
        subjects=len(set(f["s"] for f in facts)),
        overridden=f"{sum(len(f['vals']) > 1 for f in single) / len(single):.0%} of "
                   f"{len(single)} overridable facts "
                   f"({sum(len(f['vals']) > 2 for f in single)} twice)",
        many_facts=sum(REL[f["rel"]]["many"] for f in facts),
        per_relation=dict(sorted(Counter(f["rel"] for f in facts for _ in f["vals"]).items())),
    )
    # Absent questions last, from their own RNG: nothing above changes.
    out_q += absent_questions(w, facts, ids, qs, target)
    return mems, out_q, stats


def check(mems, qs):
    ids = [m["id"] for m in mems]
    assert len(ids) == len(set(ids)), "duplicate ids"
    pos = {m["id"]: i for i, m in enumerate(mems)}
    contents = [m["content"] for m in mems]
    assert len(contents) == len(set(contents)), "duplicate statements"
    for m in mems:
        bad = BANNED.search(m["content"])
        assert bad is None, (m, bad.group(0))
    st_tpls = set(t for r in REL.values() for t in r["st"])
    q_tpls = set(t for r in REL.values() for t in r["q"] + r["p"]) | \
        set(t for _, ts in CHAINS for t in ts)
    assert not (st_tpls & q_tpls)
    norm = lambda x: re.sub(r"[^a-z0-9 ]", "", x.lower()).strip()
    stnorm = set(norm(c) for c in contents)
    texts = set()
    for q in qs:
        assert q["text"] not in texts, q["text"]
        texts.add(q["text"])
        assert norm(q["text"]) not in stnorm
        for k in ("gold", "stale", "also", "path"):
            for x in q[k]:
                assert x in pos, (q, x)
        if q["kind"] == "absent":
            assert not (q["gold"] or q["stale"] or q["also"] or q["path"]), q
            continue
        assert q["gold"]
        assert not (set(q["gold"]) & set(q["stale"]))
        if q["kind"] in ("current", "past"):
            g = q["gold"][0] if q["kind"] == "current" else q["also"][0]
            for s in q["stale"] + ([q["gold"][0]] if q["kind"] == "past" else []):
                assert pos[s] < pos[g], q
        if q["kind"] == "chain":
            assert q["gold"][0] == q["path"][-1]
            assert 2 <= len(q["path"]) <= 4


def main():
    pools, city_country = harvest(random.Random(SEED))
    sizes = {k: len(v) for k, v in sorted(pools.items()) if not k.startswith("_")}
    print("harvested:", sizes, file=sys.stderr)
    for target in SIZES:
        mems, qs, stats = build_stream(pools, city_country, target)
        check(mems, qs)
        path = os.path.join(HERE, f"stream_{target}.jsonl")
        with open(path, "w", encoding="utf-8") as fh:
            for m in mems:
                fh.write(json.dumps({"memory": m}, ensure_ascii=False) + "\n")
            for q in qs:
                fh.write(json.dumps({"question": q}, ensure_ascii=False) + "\n")
        kinds = Counter(q["kind"] + ("/overridden" if q["kind"] == "current" and q["stale"]
                                     else "") for q in qs)
        print(f"{path}: {len(mems)} statements, {len(qs)} questions, "
              f"{os.path.getsize(path):,} bytes, {dict(sorted(kinds.items()))}",
              file=sys.stderr)
        print("  ", {k: v for k, v in stats.items() if k != "per_relation"}, file=sys.stderr)
        print("   statements per relation:", stats["per_relation"], file=sys.stderr)


if __name__ == "__main__":
    main()
