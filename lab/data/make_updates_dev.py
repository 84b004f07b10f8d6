#!/usr/bin/env python3
"""Writes lab/data/updates_dev.jsonl: labelled pairs of short facts for
`engram eval updates` (issue 21, item 5). Deterministic (fixed seed):

    python3 lab/data/make_updates_dev.py > lab/data/updates_dev.jsonl

Each line: {"domain", "kind", "old", "new", "update"}. `update` is true
when the new fact replaces the old one (the old is no longer true), false
when both can be true at once. Kinds:

  positives  plain     the same statement with a new value, no update wording
             cue       update wording ("now", "moved to", "no longer", ...)
  negatives  other     the same slot for a different named subject
             compat    another, compatible fact about the same subject
             compat_cue  an update of ANOTHER slot of the same subject
                       ("Priya likes hiking." / "Priya moved to Amsterdam."):
                       update wording alone does not make a pair an update.
                       Drawn from a second random stream so that the other
                       kinds' pairs stay as they were before it was added.
             multi     a second value of a many-valued slot ("likes tea" /
                       "likes cake"): both stay true
             restate   the same fact reworded
             addition  the same fact plus a detail
"""

import json
import random
import re
import sys

SEED = 21
PEOPLE = [
    "Priya", "Marco", "Anna", "Tomasz", "Keiko", "Luis", "Fatima", "Jonas",
    "Amara", "Chen", "Sofia", "Dmitri", "Ines", "Oliver", "Noor", "Rafael",
]

# A slot: how a fact is said (stmt), reworded (para), with update wording
# (cue; {old} is the replaced value), a detail to add (add), its values,
# its subjects, and whether several values can hold at once (multi).
DOMAINS = {
    "preferences": [
        dict(stmt=["{s} drinks {v} in the morning."],
             para=["In the morning {s} usually has {v}.", "{s}'s morning drink is {v}."],
             cue=["{s} switched to {v} in the morning.", "{s} now drinks {v} in the morning.",
                  "{s} no longer drinks {old} in the morning, only {v}.",
                  "{s} drinks {v} in the morning instead of {old}."],
             add=["{s} drinks {v} in the morning, with a little milk."],
             values=["coffee", "green tea", "black tea", "matcha", "espresso", "hot chocolate"],
             subjects=PEOPLE),
        dict(stmt=["{s}'s preferred editor is {v}.", "{s} writes code in {v}."],
             para=["For coding, {s} prefers {v}."],
             cue=["{s} moved from {old} to {v}.", "{s} now uses {v} as editor.",
                  "{s} switched editors to {v}."],
             add=["{s}'s preferred editor is {v}, with vim key bindings."],
             values=["VS Code", "Neovim", "Emacs", "IntelliJ", "Helix", "Zed"],
             subjects=PEOPLE),
        dict(stmt=["{s} prefers to be contacted by {v}."],
             para=["The best way to reach {s} is {v}."],
             cue=["{s} now prefers {v} instead of {old}.",
                  "{s} no longer wants {old}; contact {s} by {v}."],
             add=["{s} prefers to be contacted by {v}, ideally before noon."],
             values=["email", "Slack", "phone", "text message", "Signal"],
             subjects=PEOPLE),
        dict(stmt=["{s} likes {v}.", "{s} enjoys {v}."],
             para=["{s} is a fan of {v}."],
             cue=["{s} no longer likes {old}, {s} likes {v} now.",
                  "{s} went off {old} and likes {v} instead."],
             add=["{s} likes {v}, especially on weekends."],
             values=["tea", "cake", "jazz", "hiking", "sushi", "board games",
                     "Italian food", "cycling", "podcasts", "climbing"],
             subjects=PEOPLE, multi=True),
    ],
    "schedules": [
        dict(stmt=["The {s} is at {v}.", "The {s} starts at {v}."],
             para=["The {s} begins at {v}.", "We meet for the {s} at {v}."],
             cue=["The {s} moved to {v}.", "The {s} is now at {v}.",
                  "Starting next week the {s} happens at {v}.",
                  "The {s} was moved from {old} to {v}."],
             add=["The {s} is at {v} in room Kepler."],
             values=["9:00", "9:30", "10:00", "10:15", "11:00", "14:00", "15:00", "16:30"],
             subjects=["standup", "design review", "sprint planning", "retro",
                       "1:1 with Marco", "team lunch", "on-call handover", "code review"]),
        dict(stmt=["The {s} happens on {v}."],
             para=["Every week the {s} is held on {v}."],
             cue=["The {s} now happens on {v}.", "The {s} switched to {v}.",
                  "The {s} is no longer on {old}; it is on {v}."],
             add=["The {s} happens on {v}, in person."],
             values=["Mondays", "Tuesdays", "Wednesdays", "Thursdays", "Fridays"],
             subjects=["design review", "sprint planning", "retro", "team lunch",
                       "1:1 with Marco", "code review"]),
        dict(stmt=["The {s} lasts {v} minutes."],
             para=["The {s} takes {v} minutes."],
             cue=["The {s} now lasts {v} minutes.", "The {s} was changed from {old} to {v} minutes."],
             add=["The {s} lasts {v} minutes, with a short break."],
             values=["15", "20", "30", "45", "60", "90"],
             subjects=["standup", "design review", "sprint planning", "retro", "on-call handover"]),
        dict(stmt=["{s} blocks {v} for focus time."],
             para=["{s} keeps {v} free for focus work."],
             cue=["{s} no longer blocks {old}; {s} blocks {v} instead."],
             add=["{s} blocks {v} for focus time and mutes Slack."],
             values=["Monday mornings", "Wednesday afternoons", "Friday mornings",
                     "Tuesday afternoons", "Thursday mornings"],
             subjects=PEOPLE, multi=True),
    ],
    "people": [
        dict(stmt=["{s} works as a {v}.", "{s} is a {v}."],
             para=["{s}'s job title is {v}."],
             cue=["{s} is now a {v}.", "{s} was promoted to {v}.",
                  "{s} moved from {old} to {v}.", "{s} is no longer a {old}; {s} is a {v} now."],
             add=["{s} works as a {v} in the Lisbon office."],
             values=["backend engineer", "product manager", "data scientist",
                     "engineering manager", "designer", "site reliability engineer", "tech lead"],
             subjects=PEOPLE),
        dict(stmt=["{s} is on the {v} team."],
             para=["{s} belongs to the {v} team."],
             cue=["{s} moved to the {v} team.", "{s} switched to the {v} team.",
                  "{s} is no longer on the {old} team; {s} joined {v}."],
             add=["{s} is on the {v} team and leads its hiring."],
             values=["payments", "search", "platform", "mobile", "growth", "infrastructure"],
             subjects=PEOPLE),
        dict(stmt=["{s} reports to {v}."],
             para=["{s}'s manager is {v}."],
             cue=["{s} now reports to {v}.", "{s} reports to {v} instead of {old}."],
             add=["{s} reports to {v} and meets {v} every two weeks."],
             values=["Helena", "Victor", "Grace", "Samuel", "Yuki", "Omar"],
             subjects=PEOPLE),
        dict(stmt=["{s} often pairs with {v}."],
             para=["{s} and {v} often work together."],
             cue=["{s} no longer pairs with {old}; {s} pairs with {v} now."],
             add=["{s} often pairs with {v} on incident reviews."],
             values=["Helena", "Victor", "Grace", "Samuel", "Yuki", "Omar"],
             subjects=PEOPLE, multi=True),
    ],
    "places": [
        dict(stmt=["{s} lives in {v}."],
             para=["{s}'s home is in {v}.", "{s} is based in {v}."],
             cue=["{s} moved to {v}.", "{s} now lives in {v}.",
                  "{s} relocated from {old} to {v}.", "{s} no longer lives in {old}; {s} lives in {v}."],
             add=["{s} lives in {v} with two cats."],
             values=["Berlin", "Amsterdam", "Lisbon", "Toronto", "Osaka", "Madrid", "Nairobi", "Oslo"],
             subjects=PEOPLE),
        dict(stmt=["{s} works from the {v} office."],
             para=["{s}'s desk is in the {v} office."],
             cue=["{s} now works from the {v} office.", "{s} moved to the {v} office.",
                  "{s} switched from the {old} office to {v}."],
             add=["{s} works from the {v} office on the third floor."],
             values=["London", "Dublin", "Warsaw", "Singapore", "Austin", "Munich"],
             subjects=PEOPLE),
        dict(stmt=["The {s} is in {v}."],
             para=["The {s} takes place in {v}."],
             cue=["The {s} moved to {v}.", "The {s} is now in {v} instead of {old}."],
             add=["The {s} is in {v}, near the old harbour."],
             values=["Porto", "Krakow", "Valencia", "Edinburgh", "Tallinn", "Bologna"],
             subjects=["team offsite", "summer party", "annual conference", "hackathon"]),
        dict(stmt=["{s} has visited {v}."],
             para=["{s} has been to {v}."],
             cue=[],
             add=["{s} has visited {v} twice."],
             values=["Kyoto", "Reykjavik", "Cape Town", "Lima", "Hanoi", "Marrakesh"],
             subjects=PEOPLE, multi=True),
    ],
    "numbers": [
        dict(stmt=["{s}'s monthly budget for books is {v} euros."],
             para=["{s} spends up to {v} euros a month on books."],
             cue=["{s}'s monthly budget for books is now {v} euros.",
                  "{s} changed the book budget from {old} to {v} euros."],
             add=["{s}'s monthly budget for books is {v} euros, e-books included."],
             values=["40", "50", "60", "80", "100", "120"],
             subjects=PEOPLE),
        dict(stmt=["The {s} team has {v} engineers."],
             para=["There are {v} engineers on the {s} team."],
             cue=["The {s} team now has {v} engineers.", "The {s} team grew from {old} to {v} engineers."],
             add=["The {s} team has {v} engineers and one designer."],
             values=["4", "5", "6", "7", "8", "9", "11", "12"],
             subjects=["payments", "search", "platform", "mobile", "growth"]),
        dict(stmt=["The {s} API rate limit is {v} requests per minute."],
             para=["The {s} API allows {v} requests per minute."],
             cue=["The {s} API rate limit was raised to {v} requests per minute.",
                  "The {s} API rate limit is now {v} requests per minute."],
             add=["The {s} API rate limit is {v} requests per minute per key."],
             values=["100", "300", "600", "1000", "1200", "5000"],
             subjects=["billing", "search", "export", "reporting", "upload"]),
        dict(stmt=["{s}'s desk number is {v}."],
             para=["{s} sits at desk {v}."],
             cue=["{s} moved to desk {v}.", "{s}'s desk number changed from {old} to {v}."],
             add=["{s}'s desk number is {v}, by the window."],
             values=["12", "17", "23", "31", "42", "58", "64"],
             subjects=PEOPLE),
        dict(stmt=["The {s} service exposes port {v}."],
             para=["The {s} service listens on port {v}."],
             cue=["The {s} service no longer exposes port {old}; it uses {v} now."],
             add=["The {s} service exposes port {v} for metrics."],
             values=["8080", "9090", "50051", "443", "5432", "6379"],
             subjects=["billing", "search", "export", "reporting", "upload"], multi=True),
    ],
    "projects": [
        dict(stmt=["Project {s} uses {v} as its database."],
             para=["Project {s} stores its data in {v}."],
             cue=["Project {s} switched to {v}.", "Project {s} moved from {old} to {v}.",
                  "Project {s} now uses {v} instead of {old}."],
             add=["Project {s} uses {v} as its database, with nightly backups."],
             values=["Postgres", "MySQL", "SQLite", "MongoDB", "DynamoDB", "Cassandra"],
             subjects=["Atlas", "Beacon", "Nimbus", "Orion", "Falcon", "Quartz", "Juniper"]),
        dict(stmt=["The {s} launch is planned for {v}.", "Project {s} ships on {v}."],
             para=["Project {s} is scheduled to launch on {v}."],
             cue=["The {s} launch was moved to {v}.", "The {s} launch is now planned for {v}.",
                  "Project {s} no longer ships on {old}; it ships on {v}."],
             add=["The {s} launch is planned for {v}, with a beta a week earlier."],
             values=["March 3", "April 14", "May 20", "June 1", "July 8", "September 15"],
             subjects=["Atlas", "Beacon", "Nimbus", "Orion", "Falcon", "Quartz", "Juniper"]),
        dict(stmt=["Project {s} is owned by {v}."],
             para=["{v} owns project {s}."],
             cue=["Project {s} is now owned by {v}.", "Ownership of project {s} moved from {old} to {v}."],
             add=["Project {s} is owned by {v}, with Grace as backup."],
             values=["Helena", "Victor", "Samuel", "Yuki", "Omar", "Priya"],
             subjects=["Atlas", "Beacon", "Nimbus", "Orion", "Falcon", "Quartz", "Juniper"]),
        dict(stmt=["Project {s} depends on {v}."],
             para=["Project {s} needs {v} to run."],
             cue=["Project {s} no longer depends on {old}; it uses {v} instead."],
             add=["Project {s} depends on {v} in production."],
             values=["Redis", "Kafka", "gRPC", "Elasticsearch", "RabbitMQ", "S3"],
             subjects=["Atlas", "Beacon", "Nimbus", "Orion", "Falcon", "Quartz", "Juniper"],
             multi=True),
    ],
}

# Pairs per kind and domain.
COUNTS = dict(plain=12, cue=14, other=9, compat=9, multi=7, restate=6, addition=6, compat_cue=8)


def fill(t, s, v, old=""):
    out = re.sub(r"\ba ([aeiou])", r"an \1", t.format(s=s, v=v, old=old))
    return out[0].upper() + out[1:]


def pairs(rng, cue_rng, domain, slots):
    single = [x for x in slots if not x.get("multi")]
    multi = [x for x in slots if x.get("multi")]
    seen = set()
    out = []

    def add(kind, old, new, update):
        if (old, new) in seen or old == new:
            return False
        seen.add((old, new))
        out.append(dict(domain=domain, kind=kind, old=old, new=new, update=update))
        return True

    def take(kind, make):
        n = 0
        while n < COUNTS[kind]:
            n += bool(make())

    def plain():
        sl = rng.choice(single)
        s = rng.choice(sl["subjects"])
        a, b = rng.sample(sl["values"], 2)
        return add("plain", fill(rng.choice(sl["stmt"]), s, a), fill(rng.choice(sl["stmt"]), s, b), True)

    def cue():
        sl = rng.choice([x for x in slots if x["cue"]])
        s = rng.choice(sl["subjects"])
        a, b = rng.sample(sl["values"], 2)
        return add("cue", fill(rng.choice(sl["stmt"]), s, a), fill(rng.choice(sl["cue"]), s, b, a), True)

    def other():
        sl = rng.choice(slots)
        s, t = rng.sample(sl["subjects"], 2)
        a, b = rng.choice([rng.sample(sl["values"], 2), [rng.choice(sl["values"])] * 2])
        t1 = rng.choice(sl["stmt"])
        return add("other", fill(t1, s, a), fill(t1, t, b), False)

    def compat():
        a_sl, b_sl = rng.sample(slots, 2)
        shared = [s for s in a_sl["subjects"] if s in b_sl["subjects"]]
        if not shared:
            return False
        s = rng.choice(shared)
        old = fill(rng.choice(a_sl["stmt"]), s, rng.choice(a_sl["values"]))
        new = fill(rng.choice(b_sl["stmt"]), s, rng.choice(b_sl["values"]))
        return add("compat", old, new, False)

    def many():
        sl = rng.choice(multi)
        s = rng.choice(sl["subjects"])
        a, b = rng.sample(sl["values"], 2)
        return add("multi", fill(rng.choice(sl["stmt"]), s, a), fill(rng.choice(sl["stmt"]), s, b), False)

    def restate():
        sl = rng.choice(slots)
        s, v = rng.choice(sl["subjects"]), rng.choice(sl["values"])
        return add("restate", fill(rng.choice(sl["stmt"]), s, v), fill(rng.choice(sl["para"] + sl["stmt"]), s, v), False)

    def addition():
        sl = rng.choice(slots)
        s, v = rng.choice(sl["subjects"]), rng.choice(sl["values"])
        return add("addition", fill(sl["stmt"][0], s, v), fill(rng.choice(sl["add"]), s, v), False)

    def compat_cue():
        a_sl, b_sl = cue_rng.sample(slots, 2)
        shared = [s for s in a_sl["subjects"] if s in b_sl["subjects"]]
        if not shared or not b_sl["cue"]:
            return False
        s = cue_rng.choice(shared)
        old = fill(cue_rng.choice(a_sl["stmt"]), s, cue_rng.choice(a_sl["values"]))
        b_old, b_new = cue_rng.sample(b_sl["values"], 2)
        new = fill(cue_rng.choice(b_sl["cue"]), s, b_new, b_old)
        return add("compat_cue", old, new, False)

    for kind, make in [("plain", plain), ("cue", cue), ("other", other), ("compat", compat),
                       ("multi", many), ("restate", restate), ("addition", addition),
                       ("compat_cue", compat_cue)]:
        take(kind, make)
    return out


def main():
    rng = random.Random(SEED)
    cue_rng = random.Random(SEED + 1)
    for domain, slots in DOMAINS.items():
        for p in pairs(rng, cue_rng, domain, slots):
            sys.stdout.write(json.dumps(p, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
