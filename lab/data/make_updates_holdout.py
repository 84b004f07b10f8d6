#!/usr/bin/env python3
"""Independent held-out set of (old fact, new fact) pairs for update detection.

Written from scratch (issue 21) without looking at the detector or the dev set.
Each line printed to stdout is a JSON object with the keys
  domain, kind, old, new, update
where `update` is true when the new fact replaces the old one (the old one is
no longer true) and false when both can be true at the same time.

Kinds:
  update=true : plain (same statement, new value, no update wording)
                cue   (new fact uses update wording: now, moved, switched ...)
  update=false: other (same statement about a different subject)
                compat (another compatible fact about the same subject)
                multi (a second value of a slot that holds several values)
                restate (same fact reworded)
                addition (same fact plus an extra detail)

Usage: python3 lab/data/make_updates_holdout.py > lab/data/updates_holdout.jsonl
Python 3.11 stdlib only; deterministic (fixed seed).
"""
import json
import random

SEED = 2121
POSITIVE = {"plain": True, "cue": True, "other": False, "compat": False,
            "multi": False, "restate": False, "addition": False}
# per-domain target counts (hand-written pairs count towards these)
TARGET = {"plain": 11, "cue": 13, "other": 7, "compat": 7,
          "multi": 9, "restate": 7, "addition": 6}

NAMES = ["Maya", "Tom", "Priya", "Jonas", "Aisha", "Carlos", "Lena", "Kenji",
         "Fatima", "Oliver", "Sofia", "Daniel", "Grace", "Mateo", "Hannah", "Ravi"]
MONTHS = ["January", "March", "April", "June", "September", "October",
          "November", "May 1", "last week"]


def subj(name):
    if name is None:
        return {"S": "The user", "s": "the user", "P": "The user's", "p": "the user's"}
    return {"S": name, "s": name, "P": name + "'s", "p": name + "'s"}


def lower_first(sent):
    """Lower-case the first word for use mid-sentence, unless it is a proper noun."""
    if sent.split(" ", 1)[0] in ("The", "A", "An", "Recycling", "There", "On", "One"):
        return sent[0].lower() + sent[1:]
    return sent


class Slot:
    def __init__(self, group, stmts, values, cues=(), adds=(), extras=(),
                 multi=False, gen="an", subject=True, mono=False):
        self.group = group          # slots in the same group may conflict
        self.stmts = list(stmts)    # phrasings of the same statement
        self.values = list(values)  # ordered ascending where UP:/DOWN: cues are used
        self.cues = list(cues)      # update wordings (may use {O} = old value)
        self.adds = list(adds)      # statement + extra detail {X}
        self.extras = list(extras)
        self.multi = multi          # slot holds several values at once
        self.gen = "" if multi else gen  # generic cue wrappers: a=As of, n=now, t=these days
        self.subject = subject      # False: no person subject ("The car ...")
        self.mono = mono            # values only move upwards (levels, versions, expiry dates)


def fill(tpl, sub, v, o=None, x=None):
    kw = dict(sub) if sub else {}
    kw.update(V=v, O=o, X=x)
    out = tpl.format(**kw)
    return out[0].upper() + out[1:]


# --------------------------------------------------------------------------
# Template slots per domain
# --------------------------------------------------------------------------
DOCS = ["Dr. Lee", "Dr. Patel", "Dr. Okafor", "Dr. Nguyen", "Dr. Rossi", "Dr. Hartmann"]
GPS = ["Dr. Amara Osei", "Dr. Felix Brandt", "Dr. Sarah Cohen", "Dr. Ivan Petrov", "Dr. Mei Chen"]

SLOTS = {
    "health": [
        Slot("dentist",
             ["{P} dentist is {V}.", "{S} goes to {V} for dental care.", "{S} sees {V} as a dentist."],
             DOCS,
             ["{S} switched dentists from {O} to {V}.", "{S} now sees {V} for dental care.",
              "{S} changed dentists and now goes to {V}.",
              "{S} no longer sees {O}; {p} dentist is {V} now."],
             ["{P} dentist is {V}, whose practice is {X}.", "{S} sees {V} as a dentist, at a clinic {X}."],
             ["on Elm Street", "near the train station", "two blocks from the office", "in the old town"]),
        Slot("gp",
             ["{P} family doctor is {V}.", "{S} is registered with {V} as a GP.", "{P} GP is {V}."],
             GPS,
             ["{S} moved to a new GP, {V}.", "{P} family doctor is now {V}.",
              "{S} changed GPs from {O} to {V}.", "{S} has been transferred from {O} to {V} as a GP."],
             ["{P} family doctor is {V}, {X}."],
             ["who works at the Riverside health centre", "who is available on weekday mornings",
              "based at the Northgate clinic"]),
        Slot("diet",
             ["{S} follows a {V} diet.", "{S} eats a {V} diet.", "{P} diet is {V}."],
             ["vegetarian", "vegan", "pescatarian", "paleo", "keto"],
             ["{S} switched from a {O} diet to a {V} diet.", "{S} now follows a {V} diet.",
              "{S} gave up the {O} diet and is on a {V} diet now.",
              "{S} is no longer {O} and eats a {V} diet instead."],
             ["{S} follows a {V} diet {X}."],
             ["for health reasons", "on the advice of a nutritionist", "and cooks most meals at home"],
             gen="ant"),
        Slot("allergy",
             ["{S} is allergic to {V[0]}.", "{S} has a {V[1]} allergy.", "{S} has an allergy to {V[0]}."],
             [("peanuts", "peanut"), ("shellfish", "shellfish"), ("penicillin", "penicillin"),
              ("pollen", "pollen"), ("latex", "latex"), ("tree nuts", "tree nut"),
              ("eggs", "egg"), ("sesame", "sesame")],
             ["{S} is no longer allergic to {O[0]}.", "{P} {O[1]} allergy has cleared up completely."],
             ["{S} is allergic to {V[0]} and {X}.", "{S} has a severe {V[1]} allergy."],
             ["carries an EpiPen", "keeps antihistamines at home", "has had the allergy since childhood"],
             multi=True),
        Slot("statin",
             ["{S} takes {V} mg of atorvastatin daily.", "{S} takes {V} milligrams of atorvastatin every day.",
              "{P} daily atorvastatin dose is {V} mg."],
             ["10", "20", "40", "80"],
             ["UP:{P} atorvastatin dose was raised to {V} mg.", "DOWN:{P} atorvastatin dose was lowered to {V} mg.",
              "{P} doctor changed the atorvastatin dose from {O} mg to {V} mg.",
              "{S} now takes {V} mg of atorvastatin a day."],
             ["{S} takes {V} mg of atorvastatin daily, {X}."],
             ["with dinner", "in the evening", "as prescribed for high cholesterol"], gen="a"),
        Slot("meds",
             ["{S} takes {V} every day.", "{S} takes {V} daily."],
             ["metformin", "lisinopril", "a vitamin D supplement", "an antihistamine", "omeprazole", "iron tablets"],
             ["{S} stopped taking {O} and started {V}.", "{S} no longer takes {O}.",
              "{P} doctor replaced {O} with {V}."],
             ["{S} takes {V} every day, {X}."],
             ["in the morning", "with breakfast", "as prescribed by the family doctor"],
             multi=True),
        Slot("running",
             ["{S} runs {V} times a week.", "{S} goes running {V} times a week."],
             ["two", "three", "four", "five"],
             ["{S} now runs {V} times a week.", "UP:{S} stepped up from {O} to {V} runs a week.",
              "DOWN:{S} cut back from {O} runs a week to {V}.", "These days {s} runs {V} times a week."],
             ["{S} runs {V} times a week, {X}."],
             ["usually before work", "mostly along the river", "about 5 km each time"], gen="a"),
        Slot("gym",
             ["{P} gym is {V}.", "{S} works out at {V}.", "{S} has a membership at {V}."],
             ["FitZone", "Iron Temple", "PureGym Central", "Anytime Fitness", "the Northside"],
             ["{S} moved gyms from {O} to {V}.", "{S} left {O} and joined {V}.", "{S} now works out at {V}.",
              "{S} cancelled the membership at {O} and signed up at {V}."],
             ["{S} works out at {V} {X}."],
             ["on weekday evenings", "before work", "with a personal trainer"]),
        Slot("sport",
             ["{S} plays {V}.", "{V} is one of the sports {s} plays."],
             ["tennis", "badminton", "squash", "volleyball", "five-a-side football", "table tennis"],
             ["{S} stopped playing {O} and took up {V}.", "{S} gave up {O} for good."],
             ["{S} plays {V} {X}."],
             ["on Sunday mornings", "with colleagues", "at a local club"], multi=True),
        Slot("bedtime",
             ["{S} usually goes to bed at {V}.", "{P} usual bedtime is {V}."],
             ["10 pm", "10:30 pm", "11 pm", "11:30 pm", "midnight"],
             ["{S} now goes to bed at {V}.", "{S} moved bedtime from {O} to {V}.",
              "These days {s} goes to bed at {V}."],
             ["{S} usually goes to bed at {V} and {X}."],
             ["reads for half an hour first", "gets up around seven"], gen="ant"),
        Slot("checkup",
             ["The next dental check-up is on {V}.", "The next check-up at the dentist is on {V}."],
             ["March 28", "May 4", "June 12", "July 3", "September 19"],
             ["The next dental check-up was moved to {V}.", "The next dental check-up has been rescheduled to {V}.",
              "The dental check-up is now on {V} instead of {O}."],
             ["The next dental check-up is on {V} at {X}."],
             ["9:30 am", "2 pm", "the clinic on Elm Street"], subject=False),
    ],
    "home": [
        Slot("address",
             ["{S} lives at {V}.", "{P} address is {V}.", "{P} home address is {V}."],
             ["12 Rose Lane", "48 Harbour Road", "7 Birch Close", "221 Elm Street", "90 Kingsway, Flat 3", "15 Mill Street"],
             ["{S} moved to {V}.", "{S} has moved from {O} to {V}.", "{P} new address is {V}.",
              "{S} moved out of {O} and now lives at {V}."],
             ["{S} lives at {V}, {X}."],
             ["in a two-bedroom flat", "near the park", "on the third floor"]),
        Slot("address",
             ["{S} lives in {V}.", "{S} is based in {V}.", "{P} home city is {V}."],
             ["Leeds", "Lyon", "Porto", "Munich", "Toronto", "Melbourne", "Austin"],
             ["{S} relocated from {O} to {V}.", "{S} moved to {V}.", "{S} lives in {V} now.",
              "{S} left {O} and settled in {V}."],
             ["{S} lives in {V}, {X}."],
             ["in a flat near the centre", "close to family", "in a quiet suburb"]),
        Slot("address",
             ["{P} landlord is {V}.", "{S} rents from {V}."],
             ["Mr. Evans", "Greenway Lettings", "Mrs. Alvarez", "Northside Properties", "Mr. Kowalski"],
             ["{P} building was sold, and the new landlord is {V}.", "{P} landlord is now {V}.",
              "{S} now rents from {V} instead of {O}."],
             ["{P} landlord is {V}, {X}."],
             ["who lives downstairs", "who is easy to reach by email", "who also owns the house next door"]),
        Slot("pets",
             ["{S} has a {V}.", "{S} owns a {V}."],
             ["dog named Rex", "cat named Luna", "rabbit named Clover", "parrot named Kiwi",
              "dog named Biscuit", "cat named Miso"],
             [],
             ["{S} has a {V}, {X}."],
             ["who is three years old", "adopted from a shelter", "who sleeps on the sofa"], multi=True),
        Slot("catcount",
             ["{S} has {V} cats.", "{S} owns {V} cats.", "{S} keeps {V} cats at home."],
             ["two", "three", "four", "five"],
             ["{S} now has {V} cats.", "UP:{S} adopted another cat and now has {V}.",
              "The number of cats {s} has went from {O} to {V}."],
             ["{S} has {V} cats, {X}."],
             ["all of them rescues", "which are fed twice a day"], gen="a"),
        Slot("car",
             ["{S} drives a {V}.", "{P} car is a {V}."],
             ["blue Honda Civic", "grey Toyota Corolla", "red Mazda 3", "white Tesla Model 3",
              "black Volkswagen Golf", "silver Ford Focus"],
             ["{S} sold the {O} and bought a {V}.", "{S} replaced the {O} with a {V}.",
              "{S} now drives a {V}.", "{S} traded in the {O} for a {V}."],
             ["{S} drives a {V}, {X}."],
             ["bought second-hand", "mostly for the commute", "which is usually parked on the street"]),
        Slot("parking",
             ["The car is parked in {V}.", "The car's usual spot is {V}."],
             ["bay 14", "the underground garage", "space 22 on level 2", "the driveway"],
             ["The car is now parked in {V}.", "The car has been moved to {V}.",
              "The car is no longer kept in {O}; it's in {V} now."],
             ["The car is parked in {V}, {X}."],
             ["next to the lift", "near the exit"], subject=False),
        Slot("internet",
             ["{P} home internet provider is {V}.", "{P} home broadband is with {V}."],
             ["Virgin Media", "BT", "Vodafone", "Comcast", "Sky"],
             ["{S} switched internet providers from {O} to {V}.", "{P} home internet is with {V} now.",
              "{S} cancelled {O} broadband and signed up with {V}."],
             ["{P} home internet provider is {V}, {X}."],
             ["on a 500 Mbps plan", "with the router in the hallway"]),
        Slot("bins",
             ["Recycling is collected on {V}.", "The recycling bins are emptied on {V}."],
             ["Mondays", "Tuesdays", "Thursdays", "Fridays"],
             ["Recycling collection moved to {V}.", "Recycling is now collected on {V}.",
              "As of {M}, recycling is collected on {V} instead of {O}."],
             ["Recycling is collected on {V}, {X}."],
             ["early in the morning", "so the bins go out the night before"], subject=False, gen="a"),
        Slot("plants",
             ["{S} grows {V} on the balcony.", "There are {V} growing on {p} balcony."],
             ["tomatoes", "strawberries", "chillies", "sunflowers", "runner beans"],
             [],
             ["{S} grows {V} on the balcony, {X}."],
             ["in big clay pots", "from seed every spring"], multi=True),
    ],
    "travel": [
        Slot("trip",
             ["{P} next trip is to {V}.", "{P} upcoming trip is to {V}."],
             ["Lisbon", "Kyoto", "Reykjavik", "Cape Town", "Montreal", "Rome", "Hanoi"],
             ["{S} changed the next trip from {O} to {V}.", "{P} next trip is now to {V} instead of {O}.",
              "{S} cancelled the {O} trip and is going to {V} instead."],
             ["{P} next trip is to {V}, {X}."],
             ["in early May", "for about ten days", "to visit friends"]),
        Slot("trip",
             ["{P} flight to Berlin leaves at {V}.", "{P} flight to Berlin departs at {V}.",
              "The departure time of {p} Berlin flight is {V}."],
             ["7:15 am", "9:40 am", "1:05 pm", "6:30 pm", "10:50 pm"],
             ["{P} flight to Berlin was rescheduled to {V}.", "{P} flight to Berlin now leaves at {V}.",
              "The airline moved {p} Berlin flight from {O} to {V}."],
             ["{P} flight to Berlin leaves at {V} from {X}."],
             ["Terminal 2", "gate B14", "Heathrow"]),
        Slot("trip",
             ["{S} is staying at {V} in Paris.", "{P} hotel in Paris is {V}."],
             ["Hotel Lumière", "the Grand Hotel", "Le Petit Jardin", "Hôtel des Arts", "the Ibis near Gare du Nord"],
             ["{S} switched the Paris booking from {O} to {V}.",
              "{S} cancelled {O} and booked {V} in Paris instead.", "{P} Paris hotel is now {V}."],
             ["{P} hotel in Paris is {V}, {X}."],
             ["booked for four nights", "with breakfast included"]),
        Slot("worktrips",
             ["{S} often travels to {V} for work.", "{S} makes frequent work trips to {V}.",
              "{V} is a regular work destination for {s}."],
             ["Frankfurt", "Singapore", "Chicago", "Madrid", "Dubai", "Warsaw"],
             ["{S} no longer travels to {O} for work.", "{S} stopped the work trips to {O}."],
             ["{S} often travels to {V} for work, {X}."],
             ["usually for a few days", "mostly to meet clients"], multi=True),
        Slot("visited",
             ["{S} has visited {V}.", "{S} has been to {V}."],
             ["Peru", "Chile", "Japan", "Morocco", "Iceland", "Vietnam", "Norway"],
             [],
             ["{S} has visited {V} {X}."],
             ["twice", "on a backpacking trip", "with family"], multi=True),
        Slot("seat",
             ["{S} prefers {V} seats on flights.", "On flights, {s} likes to sit by the {V}."],
             ["aisle", "window"],
             ["{S} now prefers {V} seats.", "{S} switched from {O} to {V} seats on flights."],
             ["{S} prefers {V} seats on flights, {X}."],
             ["and usually books them early", "even on short trips"]),
        Slot("airline",
             ["{P} preferred airline is {V}.", "{S} usually flies with {V}."],
             ["KLM", "Lufthansa", "Delta", "Emirates", "Qantas", "Air Canada"],
             ["{S} switched to {V} as the preferred airline.", "{S} now flies mostly with {V}.",
              "{S} stopped flying with {O} and uses {V} these days."],
             ["{P} preferred airline is {V}, {X}."],
             ["because of its frequent flyer programme", "thanks to the lounge access"]),
        Slot("passport",
             ["{P} passport expires on {V}.", "{P} passport is valid until {V}."],
             ["14 August 2026", "3 March 2027", "9 June 2029", "22 November 2031"],
             ["{S} renewed the passport, and it now expires on {V}.", "{P} new passport expires on {V}."],
             ["{P} passport expires on {V}, {X}."],
             ["and is kept in the desk drawer", "according to the travel notes"], gen="", mono=True),
        Slot("rental",
             ["The rental car pickup is at {V}.", "The rental car will be picked up at {V}."],
             ["8 am", "10 am", "noon", "3:30 pm"],
             ["The rental car pickup was moved to {V}.", "The rental car pickup is now at {V}.",
              "The rental car pickup changed from {O} to {V}."],
             ["The rental car pickup is at {V} {X}."],
             ["at the airport desk", "at the downtown office"], subject=False),
        Slot("trip",
             ["{P} Japan trip lasts {V}.", "{S} will spend {V} in Japan."],
             ["five days", "ten days", "two weeks", "three weeks"],
             ["{P} Japan trip is now {V} long.", "UP:{S} extended the Japan trip to {V}.",
              "DOWN:{S} shortened the Japan trip to {V}."],
             ["{P} Japan trip lasts {V}, {X}."],
             ["starting in Tokyo", "travelling mostly by train"], gen=""),
    ],
    "finance": [
        Slot("bank",
             ["{P} main bank is {V}.", "{S} does most of the banking with {V}."],
             ["Chase", "Barclays", "Monzo", "ING", "Wells Fargo", "HSBC", "Revolut"],
             ["{S} moved the main account from {O} to {V}.", "{S} switched banks to {V}.",
              "{P} main bank is now {V}.", "{S} closed the {O} account and banks with {V} now."],
             ["{P} main bank is {V}, {X}."],
             ["where the salary is paid in", "with a joint current account"]),
        Slot("salary",
             ["{P} salary is {V[0]} a year.", "{S} earns {V[1]} a year.", "{P} annual salary is {V[0]}."],
             [("$62,000", "62,000 dollars"), ("$68,500", "68,500 dollars"),
              ("$75,000", "75,000 dollars"), ("$81,000", "81,000 dollars"), ("$90,000", "90,000 dollars")],
             ["UP:{S} got a raise to {V[0]} a year.", "{P} salary went from {O[0]} to {V[0]}.",
              "{S} now earns {V[0]} a year.", "DOWN:{S} took a pay cut to {V[0]} a year."],
             ["{P} salary is {V[0]} a year, {X}."],
             ["before tax", "paid monthly", "plus an annual bonus"], gen="a"),
        Slot("rent",
             ["{P} rent is {V[0]} a month.", "{S} pays {V[1]} a month in rent.", "{P} monthly rent is {V[0]}."],
             [("$1,150", "1,150 dollars"), ("$1,300", "1,300 dollars"), ("$1,450", "1,450 dollars"),
              ("$1,600", "1,600 dollars"), ("$1,875", "1,875 dollars")],
             ["UP:{P} landlord raised the rent to {V[0]} a month.", "UP:{P} rent went up from {O[0]} to {V[0]}.",
              "DOWN:{S} negotiated the rent down to {V[0]}.", "{P} rent is now {V[0]} a month."],
             ["{P} rent is {V[0]} a month, {X}."],
             ["due on the 1st", "paid by standing order", "including water"], gen="a"),
        Slot("groceries",
             ["{P} monthly grocery budget is {V}.", "{S} budgets {V} a month for groceries."],
             ["$300", "$400", "$450", "$600"],
             ["UP:{S} raised the grocery budget to {V}.", "DOWN:{S} cut the grocery budget to {V} a month.",
              "{S} changed the grocery budget from {O} to {V}."],
             ["{P} monthly grocery budget is {V}, {X}."],
             ["tracked in a spreadsheet", "including household supplies"], gen="a"),
        Slot("subs",
             ["{S} subscribes to {V}.", "{S} has a subscription to {V}.", "{S} pays for {V}."],
             ["Netflix", "Spotify", "The Economist", "Disney+", "a meal-kit service", "Audible", "the New York Times"],
             ["{S} cancelled {O} and subscribed to {V}.", "{S} cancelled the subscription to {O}.",
              "{S} no longer pays for {O}."],
             ["{S} subscribes to {V}, {X}."],
             ["on the annual plan", "billed monthly"], multi=True),
        Slot("spotify",
             ["{P} Spotify plan is {V}.", "{S} is on the Spotify {V} plan."],
             ["Student", "Individual", "Duo", "Family"],
             ["UP:{S} upgraded from Spotify {O} to {V}.", "DOWN:{S} downgraded the Spotify plan to {V}.",
              "{S} is on the Spotify {V} plan now."],
             ["{P} Spotify plan is {V}, {X}."],
             ["billed to a credit card", "renewed on the 5th of each month"]),
        Slot("creditlimit",
             ["{P} credit card limit is {V}.", "The limit on {p} credit card is {V}."],
             ["$2,000", "$5,000", "$8,000", "$12,000"],
             ["UP:The bank raised {p} credit limit to {V}.", "{P} credit card limit was changed to {V}.",
              "DOWN:The bank lowered {p} credit limit from {O} to {V}."],
             ["{P} credit card limit is {V}, {X}."],
             ["on a Visa card", "and the balance is paid off every month"], gen="a"),
        Slot("payday",
             ["{S} gets paid on the {V} of each month.", "{P} payday is the {V} of each month."],
             ["1st", "15th", "25th", "last working day"],
             ["{P} payday moved to the {V} of the month.", "{S} now gets paid on the {V} of each month.",
              "As of {M}, {s} is paid on the {V} instead of the {O}."],
             ["{S} gets paid on the {V} of each month, {X}."],
             ["by bank transfer", "into the main account"]),
        Slot("shares",
             ["{S} owns shares in {V}.", "{S} holds {V} stock."],
             ["Apple", "Nestlé", "Toyota", "Microsoft", "Unilever"],
             ["{S} sold all of the {O} shares and bought {V}.", "{S} no longer owns any {O} shares."],
             ["{S} owns shares in {V}, {X}."],
             ["bought through a workplace scheme", "held in a tax-free account"], multi=True),
        Slot("accountant",
             ["{P} accountant is {V}.", "{S} uses {V} as an accountant."],
             ["Helen Moore", "Raj Mehta", "Clara Weiss", "Ben Adeyemi"],
             ["{S} hired a new accountant, {V}.", "{S} replaced {O} with {V} as accountant.",
              "{S} stopped working with {O}; the accountant is {V} now."],
             ["{P} accountant is {V}, {X}."],
             ["who handles the yearly tax return", "based in the city centre"]),
    ],
    "devices": [
        Slot("phone",
             ["{P} phone is {V[0]}.", "{S} uses {V[0]} as a phone."],
             [("a Pixel 7", "Pixel 7"), ("a Samsung Galaxy S23", "Galaxy S23"), ("an iPhone 13", "iPhone 13"),
              ("an iPhone 15", "iPhone 15"), ("a OnePlus 11", "OnePlus 11"), ("a Fairphone 5", "Fairphone 5")],
             ["{S} replaced the {O[1]} with {V[0]}.", "{S} switched from the {O[1]} to {V[0]}.",
              "{P} phone is now {V[0]}.", "{S} got a new phone: {V[0]}."],
             ["{P} phone is {V[0]}, {X}."],
             ["with 256 GB of storage", "in a green case", "on a two-year contract"]),
        Slot("phone",
             ["{P} iPhone runs iOS {V}.", "{P} iPhone is on iOS {V}."],
             ["16", "17", "18"],
             ["UP:{S} upgraded the iPhone to iOS {V}.", "UP:{P} iPhone was updated to iOS {V}."],
             ["{P} iPhone runs iOS {V}, {X}."],
             ["with automatic updates turned off", "with automatic updates enabled"], gen="n", mono=True),
        Slot("laptop",
             ["{P} laptop is {V[0]}.", "{S} works on {V[0]}."],
             [("a MacBook Air", "MacBook Air"), ("a ThinkPad X1 Carbon", "ThinkPad"), ("a Dell XPS 13", "Dell XPS"),
              ("a Framework 13", "Framework"), ("an HP Spectre", "HP Spectre")],
             ["{S} replaced the {O[1]} with {V[0]}.", "{P} laptop is now {V[0]}.",
              "{S} retired the {O[1]} and works on {V[0]} now."],
             ["{P} laptop is {V[0]}, {X}."],
             ["issued by work", "with 16 GB of RAM", "bought last year"]),
        Slot("laptop",
             ["{P} laptop runs {V}.", "The operating system on {p} laptop is {V}."],
             ["Windows 10", "Windows 11", "Ubuntu 22.04", "Fedora 40", "Linux Mint"],
             ["{P} laptop was switched from {O} to {V}.", "{P} laptop runs {V} now.",
              "{S} wiped the laptop and installed {V}."],
             ["{P} laptop runs {V}, {X}."],
             ["set up for dual monitors", "with disk encryption turned on"]),
        Slot("email",
             ["{P} main email address is {V}.", "{S} uses {V} as the main email address."],
             ["sunny.days@gmail.com", "k.lane@outlook.com", "hello@ferncottage.net", "jr2049@proton.me",
              "the.walker@icloud.com"],
             ["{S} changed the main email address to {V}.", "{S} now uses {V} as the main email.",
              "{S} stopped using {O} and moved to {V}."],
             ["{P} main email address is {V}, {X}."],
             ["which is also used for online banking", "set up on both the phone and the laptop"]),
        Slot("browser",
             ["{P} default browser is {V}.", "{S} uses {V} as the default browser."],
             ["Firefox", "Chrome", "Safari", "Brave", "Edge", "Vivaldi"],
             ["{S} switched the default browser from {O} to {V}.", "{S} moved from {O} to {V} for browsing.",
              "{P} default browser is {V} now."],
             ["{P} default browser is {V}, {X}."],
             ["with an ad blocker installed", "synced across devices"], gen="at"),
        Slot("passwords",
             ["{S} keeps passwords in {V}.", "{P} password manager is {V}."],
             ["1Password", "Bitwarden", "LastPass", "KeePassXC", "Dashlane"],
             ["{S} migrated the passwords from {O} to {V}.", "{S} replaced {O} with {V} for passwords."],
             ["{S} keeps passwords in {V}, {X}."],
             ["on a family plan", "protected by a long master passphrase"], gen="at"),
        Slot("accounts",
             ["{S} has an account on {V}.", "{S} is registered on {V}."],
             ["GitHub", "Reddit", "LinkedIn", "Mastodon", "Discord", "Strava"],
             ["{S} deleted the {O} account.", "{S} closed the {O} account for good."],
             ["{S} has an account on {V}, {X}."],
             ["with two-factor authentication turned on", "under a nickname"], multi=True),
        Slot("carrier",
             ["{P} mobile carrier is {V}.", "{P} phone plan is with {V}."],
             ["Vodafone", "T-Mobile", "Verizon", "O2", "EE", "Three"],
             ["{S} ported the number from {O} to {V}.", "{S} switched carriers to {V}.",
              "{P} phone plan is with {V} now."],
             ["{P} mobile carrier is {V}, {X}."],
             ["on an unlimited data plan", "with a contract ending in December"]),
        Slot("phone",
             ["{S} wears a {V}.", "{P} smartwatch is a {V}."],
             ["Garmin Forerunner 255", "Fitbit Charge 6", "Pixel Watch 2", "Samsung Galaxy Watch 6"],
             ["{S} replaced the {O} with a {V}.", "{S} now wears a {V}."],
             ["{S} wears a {V}, {X}."],
             ["mainly to track sleep", "paired with the phone"]),
        Slot("nas",
             ["The home NAS has {V} of storage.", "The storage capacity of the home NAS is {V}."],
             ["2 TB", "4 TB", "8 TB", "12 TB"],
             ["UP:The home NAS was upgraded to {V} of storage.", "The home NAS now has {V} of storage."],
             ["The home NAS has {V} of storage, {X}."],
             ["set up in RAID 1", "backed up weekly to the cloud"], subject=False),
        Slot("icloud",
             ["{P} iCloud plan is {V}.", "{S} pays for {V} of iCloud storage."],
             ["50 GB", "200 GB", "2 TB"],
             ["UP:{S} upgraded iCloud storage to {V}.", "DOWN:{S} downgraded the iCloud plan to {V}."],
             ["{P} iCloud plan is {V}, {X}."],
             ["shared with the family", "billed monthly"]),
    ],
    "learning": [
        Slot("spanishlevel",
             ["{P} Spanish is at {V} level.", "{P} Spanish level is {V}.", "{S} speaks Spanish at {V} level."],
             ["A1", "A2", "B1", "B2", "C1"],
             ["UP:{S} reached {V} in Spanish.", "UP:{S} moved up from {O} to {V} in Spanish.",
              "{P} Spanish is now at {V} level."],
             ["{P} Spanish is at {V} level, {X}."],
             ["according to a placement test", "with stronger reading than speaking"], gen="a", mono=True),
        Slot("speaks",
             ["{S} speaks {V}.", "{S} can speak {V}."],
             ["French", "Portuguese", "Mandarin", "German", "Arabic", "Japanese"],
             [],
             ["{S} speaks {V} {X}."],
             ["fluently", "at a conversational level", "at home with family"], multi=True),
        Slot("learninglang",
             ["{S} is learning {V}.", "{S} is studying {V}."],
             ["Italian", "Korean", "Dutch", "Greek", "Turkish"],
             ["{S} stopped learning {O} and started {V}.", "{S} gave up on {O} and is learning {V} now."],
             ["{S} is learning {V} {X}."],
             ["with an app", "in an evening class", "ahead of a trip"], multi=True),
        Slot("course",
             ["{S} is taking an online course in {V}.", "{S} is enrolled in an online {V} course."],
             ["statistics", "web design", "Python", "art history", "photography", "accounting"],
             ["{S} dropped the {O} course and signed up for a course in {V} instead.",
              "{S} quit the online {O} course."],
             ["{S} is taking an online course in {V}, {X}."],
             ["on Coursera", "two evenings a week", "paid for by work"], multi=True),
        Slot("instrument",
             ["{S} plays the {V[0]}.", "{S} is a {V[1]}."],
             [("piano", "pianist"), ("guitar", "guitarist"), ("cello", "cellist"), ("violin", "violinist"),
              ("drums", "drummer"), ("saxophone", "saxophonist")],
             ["{S} gave up the {O[0]} and took up the {V[0]}.", "{S} no longer plays the {O[0]}."],
             ["{S} plays the {V[0]} {X}."],
             ["every evening", "for fun", "at a beginner level"], multi=True),
        Slot("teacher",
             ["{P} piano teacher is {V}.", "{S} has piano lessons with {V}."],
             ["Ms. Novak", "Mr. Laurent", "Mrs. Ito", "Ms. Dube", "Mr. García"],
             ["{S} switched piano teachers from {O} to {V}.", "{S} now has piano lessons with {V}.",
              "{P} new piano teacher is {V}."],
             ["{P} piano teacher is {V}, {X}."],
             ["who teaches from a studio downtown", "who also plays in an orchestra"]),
        Slot("lesson",
             ["{P} guitar lesson is on {V}.", "{S} has guitar lessons on {V}."],
             ["Mondays at 5 pm", "Tuesdays at 6:30 pm", "Thursdays at 4 pm", "Saturdays at 10 am"],
             ["{P} guitar lesson moved to {V}.", "{P} guitar lesson is now on {V}.",
              "The guitar lesson was rescheduled from {O} to {V}."],
             ["{P} guitar lesson is on {V}, {X}."],
             ["and lasts an hour", "at the music school"]),
        Slot("favbook",
             ["{P} favourite book is {V}.", "The book {s} loves most is {V}."],
             ["Dune", "Middlemarch", "The Hobbit", "Beloved", "One Hundred Years of Solitude", "The Remains of the Day"],
             ["{P} favourite book is now {V}.", "{S} says {V} has replaced {O} as the favourite book."],
             ["{P} favourite book is {V}, {X}."],
             ["which gets reread every summer", "first read at school"]),
        Slot("readbooks",
             ["{S} has read {V}.", "{S} finished reading {V}."],
             ["Dune", "Middlemarch", "The Hobbit", "Beloved", "Jane Eyre", "The Remains of the Day"],
             [],
             ["{S} has read {V} {X}."],
             ["twice", "for a book club", "on holiday last summer"], multi=True),
        Slot("streak",
             ["{P} Duolingo streak is {V} days.", "{S} has a {V}-day Duolingo streak."],
             ["45", "120", "200", "365"],
             ["UP:{P} Duolingo streak has grown to {V} days.", "{P} Duolingo streak is now {V} days."],
             ["{P} Duolingo streak is {V} days, {X}."],
             ["all in the Spanish course", "kept up with daily ten-minute lessons"], mono=True),
        Slot("hobbies",
             ["{S} enjoys {V} as a hobby.", "One of {p} hobbies is {V}."],
             ["birdwatching", "pottery", "rock climbing", "baking bread", "chess", "knitting"],
             ["{S} gave up {O} and took up {V}.", "{S} lost interest in {O} and doesn't do it any more."],
             ["{S} enjoys {V} as a hobby, {X}."],
             ["mostly on weekends", "with a local club"], multi=True),
    ],
}

# --------------------------------------------------------------------------
# Hand-written one-off pairs: (domain, kind, old, new)
# --------------------------------------------------------------------------
HAND = [
    # health
    ("health", "plain", "Maya's blood pressure medication is amlodipine.", "Maya's blood pressure medication is losartan."),
    ("health", "plain", "The user's resting heart rate is around 72 bpm.", "The user's resting heart rate is around 64 bpm."),
    ("health", "cue", "Tom walks to work every day.", "Since the knee surgery, Tom takes the bus to work instead of walking."),
    ("health", "cue", "Priya drinks three coffees a day.", "Priya has cut out coffee completely and drinks green tea now."),
    ("health", "cue", "Jonas does yoga on Tuesday evenings.", "Jonas stopped doing yoga and started pilates on Tuesday evenings."),
    ("health", "cue", "Aisha wears glasses for reading.", "Aisha had laser eye surgery and no longer needs reading glasses."),
    ("health", "other", "Maya's dentist is Dr. Lee.", "Maya's son's dentist is Dr. Patel."),
    ("health", "other", "Carlos is training for the Berlin marathon.", "Carlos's sister is training for the Berlin marathon."),
    ("health", "compat", "Lena's dentist is Dr. Okafor.", "Lena has a dental check-up next Thursday."),
    ("health", "compat", "Kenji is vegetarian.", "Kenji's favourite dish is mushroom risotto."),
    ("health", "multi", "Fatima takes vitamin D every morning.", "Fatima takes magnesium every evening."),
    ("health", "multi", "Daniel sees a physiotherapist for his back.", "Daniel sees a chiropractor for his neck."),
    ("health", "restate", "Oliver goes to the gym at 6 am on weekdays.", "On weekdays, Oliver hits the gym at six in the morning."),
    ("health", "restate", "The user's GP is Dr. Amara Osei.", "Dr. Osei is the user's family doctor."),
    ("health", "addition", "Sofia is allergic to penicillin.", "Sofia is allergic to penicillin and gets a rash whenever she takes it."),
    # home
    ("home", "plain", "Maya's flat is on the 4th floor.", "Maya's flat is on the 2nd floor."),
    ("home", "plain", "The spare key is under the flowerpot by the back door.", "The spare key is in the kitchen drawer."),
    ("home", "cue", "Tom rents a one-bedroom flat in Camden.", "Tom bought a house in Walthamstow and moved out of the Camden flat."),
    ("home", "cue", "The user's dog is walked by a neighbour on weekdays.", "The user hired a dog walker, so the neighbour doesn't walk the dog any more."),
    ("home", "cue", "Priya's car is a 2014 Ford Fiesta.", "Priya sold her Fiesta and now gets around by e-bike."),
    ("home", "cue", "The boiler is serviced by HeatRight.", "As of this year, the boiler is serviced by Warmflow instead of HeatRight."),
    ("home", "other", "Jonas lives at 12 Rose Lane.", "Jonas's parents live at 48 Harbour Road."),
    ("home", "other", "Aisha's car is a red Mazda 3.", "Aisha's partner drives a white Tesla Model 3."),
    ("home", "compat", "Carlos lives in Porto.", "Carlos works from home on Fridays."),
    ("home", "compat", "Lena's landlord is Mr. Evans.", "Lena's landlord fixed the leaking tap last week."),
    ("home", "multi", "Fatima grows tomatoes on the balcony.", "Fatima grows basil on the windowsill."),
    ("home", "restate", "The car is a blue Honda Civic.", "The car is a Honda Civic, painted blue."),
    ("home", "restate", "Oliver moved into his current flat in 2019.", "Oliver has lived in his current flat since 2019."),
    ("home", "addition", "Sofia has a cat named Luna.", "Sofia has a cat named Luna, a grey tabby who is nine years old."),
    # travel
    ("travel", "plain", "Maya's frequent flyer status with KLM is Silver.", "Maya's frequent flyer status with KLM is Gold."),
    ("travel", "plain", "The user's hotel check-in in Rome is on June 12.", "The user's hotel check-in in Rome is on June 14."),
    ("travel", "cue", "Tom's flight to Madrid is on Friday morning.", "Tom's Madrid flight got moved to Saturday evening."),
    ("travel", "cue", "Priya is flying to Tokyo via Helsinki.", "Priya rebooked and is now flying to Tokyo via Doha."),
    ("travel", "cue", "Jonas has a trip to Iceland planned for October.", "Jonas called off the October trip to Iceland."),
    ("travel", "cue", "Aisha always takes the train to Paris.", "These days Aisha flies to Paris instead of taking the train."),
    ("travel", "other", "Carlos is going to Lisbon in May.", "Carlos's brother is going to Seville in May."),
    ("travel", "compat", "Lena's flight to Oslo leaves at 7:15 am.", "Lena has a window seat on the Oslo flight."),
    ("travel", "compat", "Kenji is staying at the Grand Hotel in Vienna.", "Kenji wants to visit the Belvedere while in Vienna."),
    ("travel", "multi", "Oliver has a Schengen visa.", "Oliver has a US tourist visa."),
    ("travel", "restate", "Sofia's train to Edinburgh departs at 09:30.", "Sofia's Edinburgh train leaves at half past nine in the morning."),
    ("travel", "restate", "Daniel flies to Chicago every other month for work.", "Every two months, Daniel takes a work trip to Chicago."),
    ("travel", "addition", "The user is flying to Seoul on March 3.", "The user is flying to Seoul on March 3 on an overnight Korean Air flight."),
    # finance
    ("finance", "plain", "Maya's savings goal for this year is $10,000.", "Maya's savings goal for this year is $7,500."),
    ("finance", "plain", "The user's mortgage rate is 4.2%.", "The user's mortgage rate is 5.1%."),
    ("finance", "cue", "Tom pays $15.49 a month for Netflix.", "Netflix raised its price, so Tom now pays $17.99 a month."),
    ("finance", "cue", "Priya's pension contribution is 5% of her salary.", "Priya increased her pension contribution to 8% as of April."),
    ("finance", "cue", "Jonas keeps his emergency fund in a savings account at ING.", "Jonas moved his emergency fund out of ING and into a money market fund."),
    ("finance", "cue", "Aisha pays rent by cheque.", "Aisha switched to paying rent by standing order."),
    ("finance", "other", "Carlos's rent is €950 a month.", "Carlos's flatmate pays €700 a month in rent."),
    ("finance", "compat", "Lena's salary is £48,000 a year.", "Lena is paid on the last working day of the month."),
    ("finance", "compat", "Kenji banks with HSBC.", "Kenji has a credit card from American Express."),
    ("finance", "multi", "Fatima donates monthly to the Red Cross.", "Fatima donates monthly to a local animal shelter."),
    ("finance", "restate", "Oliver's rent is $1,450 a month.", "Oliver pays fourteen hundred and fifty dollars in rent every month."),
    ("finance", "restate", "Sofia owes $3,200 on her student loan.", "Sofia's remaining student loan balance is $3,200."),
    ("finance", "addition", "Daniel has a Roth IRA.", "Daniel has a Roth IRA with Vanguard that he contributes to every January."),
    # devices
    ("devices", "plain", "Maya's phone number ends in 4471.", "Maya's phone number ends in 9023."),
    ("devices", "plain", "The user's screen time limit for social apps is one hour a day.", "The user's screen time limit for social apps is 30 minutes a day."),
    ("devices", "cue", "Tom backs up his photos to Google Photos.", "Tom stopped using Google Photos and now backs up his photos to a home NAS."),
    ("devices", "cue", "Priya's laptop is a 2017 MacBook Pro.", "Priya finally replaced her 2017 MacBook Pro with a MacBook Air M3."),
    ("devices", "cue", "Jonas uses Gmail for personal email.", "Jonas moved his personal email from Gmail to Proton Mail."),
    ("devices", "cue", "Aisha's phone is on the Android beta programme.", "Aisha left the Android beta programme and is back on the stable release."),
    ("devices", "other", "Carlos's laptop runs Windows 11.", "Carlos's daughter's laptop runs ChromeOS."),
    ("devices", "compat", "Lena's phone is a Pixel 8.", "Lena's phone has a cracked screen protector."),
    ("devices", "compat", "Kenji uses Firefox as his browser.", "Kenji's laptop is a ThinkPad X1 Carbon."),
    ("devices", "multi", "Fatima has the Slack app installed on her phone.", "Fatima has the Zoom app installed on her phone."),
    ("devices", "restate", "Oliver's laptop has 16 GB of RAM.", "Oliver's laptop comes with 16 gigabytes of memory."),
    ("devices", "restate", "Sofia's Apple ID is sofia.r@icloud.com.", "Sofia signs into her Apple account with sofia.r@icloud.com."),
    ("devices", "addition", "Daniel uses a Kindle Paperwhite.", "Daniel uses a Kindle Paperwhite, mostly for reading in bed."),
    # learning
    ("learning", "plain", "Maya is on chapter 4 of the Python course.", "Maya is on chapter 9 of the Python course."),
    ("learning", "plain", "The user's chess rating is 1350.", "The user's chess rating is 1420."),
    ("learning", "cue", "Tom practises the guitar for 20 minutes a day.", "Tom has stepped up his guitar practice to an hour a day."),
    ("learning", "cue", "Priya studies German with a private tutor.", "Priya no longer has a tutor and studies German on her own now."),
    ("learning", "cue", "Jonas is in the beginner pottery class.", "Jonas has moved up to the intermediate pottery class."),
    ("learning", "cue", "Aisha's book club meets on Wednesdays.", "Aisha's book club changed its meetings to Sundays."),
    ("learning", "other", "Carlos takes piano lessons on Saturdays.", "Carlos's son takes piano lessons on Saturdays."),
    ("learning", "compat", "Lena is learning Japanese.", "Lena wants to visit Kyoto once her Japanese improves."),
    ("learning", "multi", "Kenji has a black belt in judo.", "Kenji has a brown belt in karate."),
    ("learning", "restate", "Fatima's Spanish class is on Tuesdays at 7 pm.", "Fatima has Spanish class every Tuesday at seven in the evening."),
    ("learning", "restate", "Oliver finished reading The Hobbit.", "Oliver has read The Hobbit all the way through."),
    ("learning", "addition", "Sofia is learning the cello.", "Sofia is learning the cello, taking lessons from a retired orchestra player."),
    ("learning", "addition", "Daniel is writing a novel.", "Daniel is writing a novel, a mystery set in 1920s Glasgow."),
]


# --------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------
def pick_subject(rng, allow_user=True):
    if allow_user and rng.random() < 0.25:
        return subj(None)
    return subj(rng.choice(NAMES))


def gen_plain(rng, slot, sub):
    oi, vi = pick_pair(rng, slot)
    o, v = slot.values[oi], slot.values[vi]
    t_old = rng.choice(slot.stmts)
    t_new = t_old if rng.random() < 0.8 else rng.choice(slot.stmts)
    return fill(t_old, sub, o), fill(t_new, sub, v)


def cue_options(slot, oi, vi):
    opts = []
    for c in slot.cues:
        if c.startswith("UP:"):
            if vi > oi:
                opts.append(c[3:])
        elif c.startswith("DOWN:"):
            if vi < oi:
                opts.append(c[5:])
        else:
            opts.append(c)
    # generic wrappers around a plain statement: ("wrap", prefix, statement, suffix)
    if "a" in slot.gen:
        opts += [("wrap", "As of {M}, ", s, "") for s in slot.stmts]
    if "n" in slot.gen:
        opts += [("wrap", "", s, " now") for s in slot.stmts]
    if "t" in slot.gen:
        opts += [("wrap", "These days, ", s, "") for s in slot.stmts]
    return opts


def pick_pair(rng, slot):
    oi, vi = rng.sample(range(len(slot.values)), 2)
    if slot.mono and vi < oi:
        oi, vi = vi, oi
    return oi, vi


def gen_cue(rng, slot, sub):
    oi, vi = pick_pair(rng, slot)
    opts = cue_options(slot, oi, vi)
    if not opts:
        return None
    o, v = slot.values[oi], slot.values[vi]
    c = rng.choice(opts)
    if isinstance(c, tuple):
        _, pre, stmt, suf = c
        body = fill(stmt, sub, v)
        if pre:
            body = lower_first(body)
        new = pre.replace("{M}", rng.choice(MONTHS)) + body[:-1] + suf + "."
    else:
        new = fill(c.replace("{M}", rng.choice(MONTHS)), sub, v, o)
    return fill(rng.choice(slot.stmts), sub, o), new


def gen_multi(rng, slot, sub):
    o, v = rng.sample(slot.values, 2)
    t_old = rng.choice(slot.stmts)
    t_new = t_old if rng.random() < 0.8 else rng.choice(slot.stmts)
    return fill(t_old, sub, o), fill(t_new, sub, v)


def gen_restate(rng, slot, sub):
    v = rng.choice(slot.values)
    a, b = rng.sample(slot.stmts, 2)
    return fill(a, sub, v), fill(b, sub, v)


def gen_addition(rng, slot, sub):
    v = rng.choice(slot.values)
    return fill(rng.choice(slot.stmts), sub, v), fill(rng.choice(slot.adds), sub, v, x=rng.choice(slot.extras))


def gen_other(rng, slot, _sub):
    n1, n2 = rng.sample(NAMES, 2)  # two named people: "the user" could be either one
    o = rng.choice(slot.values)
    v = o if rng.random() < 0.4 else rng.choice([x for x in slot.values if x != o])
    t = rng.choice(slot.stmts)
    return fill(t, subj(n1), o), fill(t, subj(n2), v)


def gen_compat(rng, slots, sub):
    cand = [s for s in slots if s.subject]
    a = rng.choice(cand)
    b = rng.choice([s for s in cand if s.group != a.group])
    return (fill(rng.choice(a.stmts), sub, rng.choice(a.values)),
            fill(rng.choice(b.stmts), sub, rng.choice(b.values)))


def eligible(kind, slot):
    if kind == "plain":
        return not slot.multi
    if kind == "cue":
        return bool(slot.cues) or bool(slot.gen)
    if kind == "multi":
        return slot.multi
    if kind == "restate":
        return len(slot.stmts) >= 2
    if kind == "addition":
        return bool(slot.adds)
    if kind == "other":
        return slot.subject
    return True


GEN = {"plain": gen_plain, "cue": gen_cue, "multi": gen_multi, "restate": gen_restate,
       "addition": gen_addition, "other": gen_other}


def main():
    rng = random.Random(SEED)
    rows, seen = [], set()

    def add(domain, kind, old, new):
        key = (old, new)
        if key in seen or old == new:
            return False
        seen.add(key)
        rows.append({"domain": domain, "kind": kind, "old": old, "new": new, "update": POSITIVE[kind]})
        return True

    for d, k, o, n in HAND:
        assert d in SLOTS and k in POSITIVE, (d, k)
        add(d, k, o, n)

    for domain, slots in SLOTS.items():
        for kind, target in TARGET.items():
            have = sum(1 for r in rows if r["domain"] == domain and r["kind"] == kind)
            pool = [s for s in slots if eligible(kind, s)]
            order = []
            tries = 0
            while have < target:
                tries += 1
                assert tries < 5000, (domain, kind)
                if not order:  # round-robin over slots for variety
                    order = pool[:]
                    rng.shuffle(order)
                slot = order.pop()
                sub = pick_subject(rng)
                if kind == "compat":
                    pair = gen_compat(rng, slots, sub)
                else:
                    pair = GEN[kind](rng, slot, sub)
                if pair and add(domain, kind, *pair):
                    have += 1

    rng.shuffle(rows)
    for r in rows:
        print(json.dumps(r, ensure_ascii=False))


if __name__ == "__main__":
    main()
