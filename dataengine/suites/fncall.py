"""Function-calling suite: requests over a catalogue of 54 realistic functions, BFCL's task kinds.

In the spirit of APIGen / ToolACE, but generated offline from templates: every task offers 2-5
functions of the catalogue (fncall_tools.py: weather, finance, travel, calendar, units,
geometry, text, shopping, health, math, cooking; typed, enum, optional, list, dict and
list-of-dict arguments) and asks in one user message for what needs

- level 1, kind "irrelevance": no offered function fits (a request for a function of another
  domain, or a general question); the right answer calls nothing (gold.needs_tool False);
- level 2, kind "simple": one call of the one offered function that fits, the others from
  other domains;
- level 3, kind "multiple": one call, choosing among functions of the same domain;
- level 4, kind "parallel": 2-3 calls of the same function with other arguments;
- level 5, kind "parallel_multiple": 2-3 calls of different functions.

Gold is BFCL's possible-answer form (gold.acceptable): per call, each parameter's acceptable
values; an optional parameter the request does not mention may be omitted or given its default,
one mentioned with its default value may be omitted. The engine's AST checker
(verifiers.ArgumentsVerifier, BFCL's rules, calls in any order) judges the calls, as for BFCL's
AST categories, and "when" judges irrelevance. The functions run, so `execution_check` judges a
call list by execution too: run in the sandbox or here, its results must equal the gold calls'
results (metadata["gold_results"]), as a multiset.

Problem key: kind, offered functions and question; the split is decided by the question text
alone (Draft.split_key), so one request offered with two function sets stays in one split.
"""

from __future__ import annotations

import inspect
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from dataengine.suites.base import Draft, Suite
from dataengine.suites.fncall_tools import CITIES, DOMAIN_OF, DOMAINS, TOOLBOX, USD_PER
from dataengine.types import Gold, Task, ToolCall, canonical_json

KINDS = ("irrelevance", "simple", "multiple", "parallel", "parallel_multiple")
LEVEL = {kind: i for i, kind in enumerate(KINDS, start=1)}
# Share of each kind among drafts (BFCL's non-live categories weigh about the same way).
KIND_WEIGHTS = (0.15, 0.25, 0.25, 0.15, 0.20)
IRRELEVANT_REPLY = "None of the available functions can do that, so I cannot help with this request."

Ask = Callable[[random.Random], tuple[dict[str, Any], str]]
ASKS: dict[str, Ask] = {}


def ask(fn_name: str) -> Callable[[Ask], Ask]:
    """Register the request generator of catalogue function `fn_name`: rng -> (arguments the
    request states, the request text)."""

    def register(f: Ask) -> Ask:
        ASKS[fn_name] = f
        return f

    return register


# ---------------------------------------------------------------------------- values


def _city(rng: random.Random) -> str:
    return rng.choice(list(CITIES))


def _cities(rng: random.Random, n: int) -> list[str]:
    return rng.sample(list(CITIES), n)


def _date(rng: random.Random) -> str:
    return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _clock(rng: random.Random) -> str:
    return f"{rng.randint(6, 21):02d}:{rng.choice([0, 15, 30, 45]):02d}"


def _money(rng: random.Random, low: int, high: int) -> int | float:
    return rng.randint(low, high) if rng.random() < 0.6 else round(rng.uniform(low, high), 2)


def _num(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) and abs(x) >= 10_000 else str(x)


def _pick(rng: random.Random, *templates: str) -> str:
    return rng.choice(templates)


PEOPLE = ["ana", "ben", "chloe", "dev", "elena", "farid", "grace", "hiro", "ines", "jonas", "kim", "leo"]
DOMAINS_MAIL = ["example.com", "acme.org", "mail.net"]
TITLES = ["Team standup", "Budget review", "Dentist appointment", "Project kickoff", "Lunch with Sam",
          "Quarterly planning", "Yoga class", "Parent-teacher meeting", "Code review", "Book club"]  # fmt: skip
SENTENCES = ["The quick brown fox jumps over the lazy dog", "Never odd or even", "A man a plan a canal Panama",
             "Data engines search before they learn", "Tool use needs the right arguments",
             "Was it a car or a cat I saw", "Every morning the market opens at nine",
             "Step on no pets", "Rainy days make the best reading weather", "Hello world from the test suite",
             "Keep calm and carry on", "Madam in Eden I am Adam", "Small models can learn big habits",
             "The library closes early on Sundays"]  # fmt: skip
PRODUCTS = ["wireless headphones", "running shoes", "coffee grinder", "yoga mat", "mechanical keyboard",
            "winter jacket", "desk lamp", "science fiction novel", "tennis racket", "air fryer", "phone charger"]  # fmt: skip
COUNTRIES = ["Canada", "Germany", "Japan", "Brazil", "Australia", "India", "France", "Mexico", "Kenya", "Norway"]
TICKERS = ["AAPL", "MSFT", "GOOGL", "AMZN", "NVDA", "TSLA", "META", "NFLX", "INTC", "AMD", "IBM", "ORCL"]
INGREDIENTS = ["flour_g", "sugar_g", "butter_g", "eggs", "milk_ml", "salt_g", "rice_g", "water_ml", "onions"]


# ---------------------------------------------------------------------------- requests per function


@ask("get_current_weather")
def _(rng):
    city = _city(rng)
    args: dict[str, Any] = {"city": city}
    unit = ""
    if rng.random() < 0.5:
        args["unit"] = rng.choice(["celsius", "fahrenheit"])
        unit = f" in {args['unit']}"
    return args, _pick(rng, f"What's the weather like in {city} right now{unit}?",
                       f"Tell me the current weather in {city}{unit}.",
                       f"I'm heading out in {city}. How is the weather at the moment{unit}?")


@ask("get_weather_forecast")
def _(rng):
    city, days = _city(rng), rng.randint(1, 7)
    args: dict[str, Any] = {"city": city, "days": days}
    unit = ""
    if rng.random() < 0.4:
        args["unit"] = rng.choice(["celsius", "fahrenheit"])
        unit = f", temperatures in {args['unit']}"
    return args, _pick(rng, f"Give me the {days}-day weather forecast for {city}{unit}.",
                       f"What will the weather be in {city} over the next {days} days{unit}?",
                       f"Forecast for {city}, {days} days ahead{unit}, please.")


@ask("get_air_quality")
def _(rng):
    city = _city(rng)
    names = {"pm25": "PM2.5", "pm10": "PM10", "ozone": "ozone", "no2": "nitrogen dioxide (NO2)"}
    pollutant = rng.choice(list(names))
    return {"city": city, "pollutant": pollutant}, _pick(
        rng, f"How bad is the {names[pollutant]} level in {city} today?",
        f"Check the air quality in {city} for {names[pollutant]}.",
        f"What's the current {names[pollutant]} concentration in {city}?")


@ask("get_sunrise_sunset")
def _(rng):
    city, date = _city(rng), _date(rng)
    return {"city": city, "date": date}, _pick(
        rng, f"When does the sun rise and set in {city} on {date}?",
        f"I want to photograph the sunset in {city} on {date}. What are the sunrise and sunset times?",
        f"Sunrise and sunset for {city}, date {date}.")


@ask("convert_currency")
def _(rng):
    a, b = rng.sample(list(USD_PER), 2)
    amount = _money(rng, 5, 5000)
    return {"amount": amount, "from_currency": a, "to_currency": b}, _pick(
        rng, f"How much is {_num(amount)} {a} in {b}?", f"Convert {_num(amount)} {a} to {b}.",
        f"I have {_num(amount)} {a}. What's that worth in {b} today?")


@ask("compound_interest")
def _(rng):
    p, rate, years = rng.choice([1000, 2500, 5000, 10000, 25000]), rng.choice([2, 2.5, 3, 3.5, 4, 4.5, 5, 6]), rng.randint(1, 30)
    args: dict[str, Any] = {"principal": p, "annual_rate": rate, "years": years}
    how = ""
    if rng.random() < 0.5:
        n, word = rng.choice([(1, "yearly"), (4, "quarterly"), (12, "monthly"), (365, "daily")])
        args["compounds_per_year"] = n
        how = f", compounded {word}"
    return args, _pick(rng, f"If I deposit {_num(p)} at {rate}% a year for {years} years{how}, how much will I have?",
                       f"Compute the compound interest on {_num(p)} at an annual rate of {rate}% over {years} years{how}.",
                       f"What does a {_num(p)} savings deposit grow to in {years} years at {rate}% interest{how}?")


@ask("loan_monthly_payment")
def _(rng):
    p, rate = rng.choice([5000, 12000, 20000, 150000, 250000, 400000]), rng.choice([3, 3.9, 4.5, 5.25, 6, 7.5])
    months = rng.choice([12, 24, 36, 48, 60, 120, 180, 360])
    return {"principal": p, "annual_rate": rate, "months": months}, _pick(
        rng, f"What is the monthly payment on a {_num(p)} loan at {rate}% over {months} months?",
        f"I'm borrowing {_num(p)} at {rate}% annual interest, to repay in {months} monthly installments. How much per month?",
        f"Calculate the payment for a {months}-month loan of {_num(p)} with a {rate}% yearly rate.")


@ask("get_stock_price")
def _(rng):
    symbol = rng.choice(TICKERS)
    args: dict[str, Any] = {"symbol": symbol}
    where = ""
    if rng.random() < 0.3:
        args["exchange"] = rng.choice(["NYSE", "LSE", "TSE"])
        where = f" on the {args['exchange']}"
    return args, _pick(rng, f"What's {symbol} trading at{where}?", f"Get me the latest stock price of {symbol}{where}.",
                       f"How much is one share of {symbol}{where} right now?")


@ask("portfolio_value")
def _(rng):
    symbols = rng.sample(TICKERS, rng.randint(2, 3))
    holdings = {s: rng.randint(1, 60) for s in symbols}
    listed = ", ".join(f"{n} shares of {s}" for s, n in holdings.items())
    args: dict[str, Any] = {"holdings": holdings}
    cur = ""
    if rng.random() < 0.4:
        args["currency"] = rng.choice(["EUR", "GBP", "CAD"])
        cur = f" in {args['currency']}"
    return args, _pick(rng, f"I own {listed}. What is my portfolio worth{cur}?",
                       f"Value my holdings{cur}: {listed}.")


@ask("split_bill")
def _(rng):
    total, people = _money(rng, 30, 600), rng.randint(2, 10)
    args: dict[str, Any] = {"total": total, "people": people}
    tip = ""
    if rng.random() < 0.6:
        args["tip_percent"] = rng.choice([10, 12, 15, 18, 20, 25])
        tip = f" with a {args['tip_percent']}% tip"
    return args, _pick(rng, f"Our dinner came to {total}. Split it between {people} people{tip}.",
                       f"How much does each of {people} friends pay on a {total} bill{tip}?",
                       f"Divide a restaurant bill of {total} among {people}{tip}.")


@ask("income_tax")
def _(rng):
    names = {"US": "the US", "UK": "the UK", "DE": "Germany", "FR": "France", "CA": "Canada", "AU": "Australia"}
    country, income = rng.choice(list(names)), rng.choice([28000, 42000, 55000, 68000, 85000, 120000, 250000])
    args: dict[str, Any] = {"income": income, "country": country}
    status = ""
    if rng.random() < 0.4:
        args["filing_status"] = rng.choice(["single", "married"])
        status = " filing jointly as a married couple" if args["filing_status"] == "married" else " as a single filer"
    return args, _pick(rng, f"Estimate the income tax on {_num(income)} in {names[country]}{status}.",
                       f"How much national income tax would I pay on a salary of {_num(income)} in {names[country]}{status}?")


@ask("search_flights")
def _(rng):
    a, b = _cities(rng, 2)
    date = _date(rng)
    args: dict[str, Any] = {"origin": a, "destination": b, "date": date}
    extra = []
    if rng.random() < 0.4:
        args["cabin"] = rng.choice(["premium_economy", "business", "first"])
        extra.append(f"in {args['cabin'].replace('_', ' ')} class")
    if rng.random() < 0.3:
        args["max_stops"] = 0
        extra.append("direct flights only")
    more = (", " + ", ".join(extra)) if extra else ""
    return args, _pick(rng, f"Find flights from {a} to {b} on {date}{more}.",
                       f"I need to fly {a} to {b}, leaving {date}{more}. What are my options?",
                       f"Search for flights {a} -> {b} departing {date}{more}.")


@ask("book_hotel")
def _(rng):
    city, date, nights = _city(rng), _date(rng), rng.randint(1, 10)
    args: dict[str, Any] = {"city": city, "check_in": date, "nights": nights}
    extra = ""
    if rng.random() < 0.4:
        args["guests"] = rng.randint(2, 4)
        extra += f" for {args['guests']} guests"
    if rng.random() < 0.4:
        args["room_type"] = rng.choice(["single", "suite"])
        extra += f", a {args['room_type']} room"
    return args, _pick(rng, f"Book a hotel in {city} from {date} for {nights} nights{extra}.",
                       f"Please reserve a hotel room in {city}, checking in {date}, {nights} nights{extra}.")


@ask("get_distance")
def _(rng):
    a, b = _cities(rng, 2)
    args: dict[str, Any] = {"origin": a, "destination": b}
    unit = ""
    if rng.random() < 0.5:
        args["unit"] = rng.choice(["km", "miles"])
        unit = f" in {args['unit']}"
    return args, _pick(rng, f"How far is {a} from {b}{unit}?", f"What's the distance between {a} and {b}{unit}?",
                       f"Give me the straight-line distance from {a} to {b}{unit}.")


@ask("rent_car")
def _(rng):
    city, date, days = _city(rng), _date(rng), rng.randint(1, 14)
    args: dict[str, Any] = {"city": city, "pickup_date": date, "days": days}
    kind = ""
    if rng.random() < 0.5:
        args["car_class"] = rng.choice(["compact", "suv", "luxury"])
        kind = {"compact": " a compact car", "suv": " an SUV", "luxury": " a luxury car"}[args["car_class"]]
    return args, _pick(rng, f"Rent{kind or ' a car'} in {city} starting {date} for {days} days.",
                       f"I need{kind or ' a rental car'} in {city}: pick-up on {date}, {days} days.")


@ask("convert_time")
def _(rng):
    a, b = _cities(rng, 2)
    t = _clock(rng)
    return {"time": t, "from_city": a, "to_city": b}, _pick(
        rng, f"If it's {t} in {a}, what time is it in {b}?", f"Convert {t} {a} time to {b} time.",
        f"My call is at {t} {a} time. What's that in {b}?")


@ask("plan_route")
def _(rng):
    stops = _cities(rng, rng.randint(2, 4))
    args: dict[str, Any] = {"stops": stops}
    how = ""
    if rng.random() < 0.5:
        args["mode"] = rng.choice(["walking", "cycling", "transit"])
        how = f" by {args['mode']}" if args["mode"] != "transit" else " by public transit"
    route = " -> ".join(stops)
    return args, _pick(rng, f"Plan a route{how} through {route}, in that order.",
                       f"How long is the trip {route}{how}?")


def _mails(rng: random.Random) -> list[str]:
    return [f"{p}@{rng.choice(DOMAINS_MAIL)}" for p in rng.sample(PEOPLE, rng.randint(1, 3))]


@ask("create_event")
def _(rng):
    title, date, start = rng.choice(TITLES), _date(rng), _clock(rng)
    args: dict[str, Any] = {"title": title, "date": date, "start_time": start}
    extra = ""
    if rng.random() < 0.5:
        args["duration_minutes"] = rng.choice([15, 30, 45, 90, 120])
        extra += f" lasting {args['duration_minutes']} minutes"
    if rng.random() < 0.5:
        args["attendees"] = _mails(rng)
        extra += f", and invite {' and '.join(args['attendees'])}"
    return args, _pick(rng, f"Put '{title}' on my calendar for {date} at {start}{extra}.",
                       f"Schedule an event called {title} on {date} starting {start}{extra}.")


@ask("days_between")
def _(rng):
    a, b = sorted([_date(rng), f"2027-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"])
    return {"start_date": a, "end_date": b}, _pick(
        rng, f"How many days are there from {a} to {b}?", f"Count the days between {a} and {b}.")


@ask("add_days")
def _(rng):
    date, days = _date(rng), rng.choice([7, 10, 14, 30, 45, 60, 90, 100, -7, -30])
    if days > 0:
        return {"date": date, "days": days}, _pick(rng, f"What date is {days} days after {date}?",
                                                   f"Add {days} days to {date}.")
    return {"date": date, "days": days}, f"What date was it {-days} days before {date}?"


@ask("day_of_week")
def _(rng):
    date = _date(rng)
    return {"date": date}, _pick(rng, f"What day of the week is {date}?", f"Which weekday does {date} fall on?")


@ask("count_business_days")
def _(rng):
    a = _date(rng)
    b = f"2026-{min(12, int(a[5:7]) + rng.randint(0, 2)):02d}-28"
    a, b = sorted([a, b])
    return {"start_date": a, "end_date": b}, _pick(
        rng, f"How many working days are there from {a} to {b}, both included?",
        f"Count the business days between {a} and {b} inclusive.")


@ask("set_reminder")
def _(rng):
    what = rng.choice(["call mom", "pay the rent", "water the plants", "take my medication", "submit the report",
                       "renew my passport", "back up the laptop"])  # fmt: skip
    date, t = _date(rng), _clock(rng)
    args: dict[str, Any] = {"message": what, "date": date, "time": t}
    rep = ""
    if rng.random() < 0.5:
        args["repeat"] = rng.choice(["daily", "weekly", "monthly"])
        rep = f", repeating {args['repeat']}"
    return args, _pick(rng, f"Remind me to {what} on {date} at {t}{rep}.",
                       f"Set a reminder '{what}' for {date} {t}{rep}.")


UNIT_NAMES = {
    "mm": "millimeters", "cm": "centimeters", "m": "meters", "km": "kilometers", "in": "inches", "ft": "feet",
    "yd": "yards", "mi": "miles", "mg": "milligrams", "g": "grams", "kg": "kilograms", "t": "metric tons",
    "oz": "ounces", "lb": "pounds", "ml": "milliliters", "l": "liters", "fl_oz": "US fluid ounces", "cup": "US cups",
    "pint": "US pints", "quart": "US quarts", "gallon": "US gallons", "kmh": "km/h", "mph": "mph",
    "ms": "meters per second", "knots": "knots",
}  # fmt: skip


def _conversion(units: list[str]) -> Ask:
    def make(rng: random.Random) -> tuple[dict[str, Any], str]:
        a, b = rng.sample(units, 2)
        value = rng.choice([rng.randint(1, 500), round(rng.uniform(0.5, 200), 1)])
        src, dst = UNIT_NAMES[a], UNIT_NAMES[b]
        return {"value": value, "from_unit": a, "to_unit": b}, _pick(
            rng, f"Convert {value} {src} to {dst}.", f"How many {dst} is {value} {src}?", f"What is {value} {src} in {dst}?")

    return make


ASKS["convert_length"] = _conversion(["mm", "cm", "m", "km", "in", "ft", "yd", "mi"])
ASKS["convert_weight"] = _conversion(["mg", "g", "kg", "t", "oz", "lb"])
ASKS["convert_volume"] = _conversion(["ml", "l", "fl_oz", "cup", "pint", "quart", "gallon"])
ASKS["convert_speed"] = _conversion(["kmh", "mph", "ms", "knots"])


@ask("convert_temperature")
def _(rng):
    a, b = rng.sample(["celsius", "fahrenheit", "kelvin"], 2)
    value = {"celsius": rng.randint(-30, 120), "fahrenheit": rng.randint(-20, 250), "kelvin": rng.randint(250, 400)}[a]
    word = {"celsius": "degrees Celsius", "fahrenheit": "degrees Fahrenheit", "kelvin": "kelvin"}
    return {"value": value, "from_scale": a, "to_scale": b}, _pick(
        rng, f"Convert {value} {word[a]} to {b.capitalize()}.", f"What is {value} {word[a]} in {word[b]}?")


def _length(rng: random.Random) -> int | float:
    return rng.choice([rng.randint(1, 50), round(rng.uniform(0.5, 30), 1)])


@ask("circle_area")
def _(rng):
    r = _length(rng)
    return {"radius": r}, _pick(rng, f"What is the area of a circle with radius {r}?",
                                f"Compute the area of a circle whose radius is {r} cm.")


@ask("rectangle_properties")
def _(rng):
    a, b = _length(rng), _length(rng)
    return {"length": a, "width": b}, _pick(rng, f"A rectangle is {a} long and {b} wide. What are its area, perimeter and diagonal?",
                                            f"Give me the area and perimeter of a {a} by {b} rectangle.")


@ask("triangle_area")
def _(rng):
    a, b = _length(rng), _length(rng)
    return {"base": a, "height": b}, _pick(rng, f"Find the area of a triangle with base {a} and height {b}.",
                                           f"What's the area of a triangle whose base is {a} and height is {b}?")


@ask("point_distance")
def _(rng):
    dims = rng.choice([2, 3])
    a, b = ([rng.randint(-20, 20) for _ in range(dims)] for _ in range(2))
    pa, pb = (f"({', '.join(map(str, p))})" for p in (a, b))
    return {"point_a": a, "point_b": b}, _pick(rng, f"How far apart are the points {pa} and {pb}?",
                                               f"Compute the Euclidean distance between {pa} and {pb}.")


@ask("polygon_perimeter")
def _(rng):
    sides = [rng.randint(2, 40) for _ in range(rng.randint(3, 6))]
    listed = ", ".join(map(str, sides))
    return {"side_lengths": sides}, _pick(rng, f"What is the perimeter of a polygon with sides {listed}?",
                                          f"My garden has {len(sides)} sides measuring {listed} meters. How much fence goes around it?")


@ask("cylinder_volume")
def _(rng):
    r, h = _length(rng), _length(rng)
    return {"radius": r, "height": h}, _pick(rng, f"What is the volume of a cylinder with radius {r} and height {h}?",
                                             f"A tank is a cylinder {h} tall with a radius of {r}. How much does it hold?")


@ask("count_words")
def _(rng):
    text = rng.choice(SENTENCES)
    return {"text": text}, _pick(rng, f'How many words are in "{text}"?', f'Count the words in this sentence: "{text}"')


@ask("change_case")
def _(rng):
    text, case = rng.choice(SENTENCES), rng.choice(["upper", "lower", "title", "snake"])
    word = {"upper": "upper case", "lower": "lower case", "title": "title case", "snake": "snake_case"}[case]
    return {"text": text, "case": case}, _pick(rng, f'Convert "{text}" to {word}.', f'Rewrite "{text}" in {word}.')


@ask("is_palindrome")
def _(rng):
    text = rng.choice(SENTENCES + ["racecar", "level", "python", "rotor", "banana"])
    args: dict[str, Any] = {"text": text}
    strict = ""
    if rng.random() < 0.3:
        args["ignore_spaces"] = False
        strict = ", counting spaces"
    return args, _pick(rng, f'Is "{text}" a palindrome{strict}?', f'Check whether "{text}" reads the same backwards{strict}.')


@ask("count_character")
def _(rng):
    text = rng.choice(SENTENCES)
    ch = rng.choice([c for c in sorted(set(text.lower())) if c.isalpha()])
    args: dict[str, Any] = {"text": text, "character": ch}
    cs = ""
    if rng.random() < 0.3:
        args["case_sensitive"] = True
        cs = " (case-sensitive)"
    return args, _pick(rng, f'How many times does the letter "{ch}" appear in "{text}"{cs}?',
                       f'Count the "{ch}" characters in "{text}"{cs}.')


@ask("reverse_words")
def _(rng):
    text = rng.choice(SENTENCES)
    return {"text": text}, _pick(rng, f'Reverse the word order of "{text}".', f'Write "{text}" with its words backwards.')


@ask("truncate_text")
def _(rng):
    text, n = rng.choice(SENTENCES), rng.choice([10, 12, 15, 20, 25])
    args: dict[str, Any] = {"text": text, "max_length": n}
    suffix = ""
    if rng.random() < 0.3:
        args["suffix"] = rng.choice(["…", " [more]", "--"])
        suffix = f', ending with "{args["suffix"]}"'
    return args, _pick(rng, f'Shorten "{text}" to at most {n} characters{suffix}.',
                       f'Truncate "{text}" to {n} characters{suffix}.')


@ask("search_products")
def _(rng):
    query = rng.choice(PRODUCTS)
    args: dict[str, Any] = {"query": query}
    extra = ""
    if rng.random() < 0.4:
        args["max_price"] = rng.choice([25, 50, 80, 100, 150, 200])
        extra += f" under {args['max_price']} dollars"
    if rng.random() < 0.4:
        args["sort_by"] = rng.choice(["price_asc", "price_desc", "rating"])
        extra += {"price_asc": ", cheapest first", "price_desc": ", most expensive first",
                  "rating": ", best rated first"}[args["sort_by"]]  # fmt: skip
    if rng.random() < 0.3:
        args["category"] = rng.choice(["electronics", "books", "clothing", "home", "sports"])
        extra += f", in the {args['category']} category"
    return args, _pick(rng, f"Search the store for {query}{extra}.", f"I am shopping for {query}{extra}.",
                       f"Show me some {query}{extra}.")


@ask("cart_total")
def _(rng):
    goods = rng.sample(PRODUCTS, rng.randint(2, 3))
    items = [{"price": round(rng.uniform(3, 120), 2), "quantity": rng.randint(1, 4)} for _ in goods]
    listed = ", ".join(f"{it['quantity']} x {g} at {it['price']}" for g, it in zip(goods, items))
    args: dict[str, Any] = {"items": items}
    coupon = ""
    if rng.random() < 0.5:
        args["coupon_percent"] = rng.choice([5, 10, 15, 20])
        coupon = f" with my {args['coupon_percent']}% coupon"
    return args, _pick(rng, f"What's the total of my cart{coupon}? {listed}.", f"Add up this cart{coupon}: {listed}.")


@ask("apply_discount")
def _(rng):
    price, pct = _money(rng, 10, 900), rng.choice([5, 10, 15, 20, 25, 30, 40, 50])
    return {"price": price, "percent": pct}, _pick(rng, f"What does a {price} item cost at {pct}% off?",
                                                   f"Apply a {pct}% discount to {price}.")


@ask("estimate_shipping")
def _(rng):
    w, country = rng.choice([0.5, 1, 2, 3.5, 5, 10, 20]), rng.choice(COUNTRIES)
    args: dict[str, Any] = {"weight_kg": w, "destination_country": country}
    speed = ""
    if rng.random() < 0.5:
        args["speed"] = rng.choice(["express", "overnight"])
        speed = f" by {args['speed']} shipping"
    return args, _pick(rng, f"How much to ship a {w} kg parcel to {country}{speed}?",
                       f"Estimate shipping for {w} kg to {country}{speed}.")


@ask("track_package")
def _(rng):
    carrier = rng.choice(["ups", "fedex", "dhl", "usps"])
    number = "".join(rng.choice("ABCDEFGHJKLMNPRSTUVWXYZ0123456789") for _ in range(rng.randint(10, 14)))
    return {"tracking_number": number, "carrier": carrier}, _pick(
        rng, f"Where is my {carrier.upper()} package {number}?", f"Track {carrier.upper()} shipment {number}.")


@ask("calculate_bmi")
def _(rng):
    w, h = rng.randint(45, 120), rng.randint(150, 200)
    return {"weight_kg": w, "height_cm": h}, _pick(rng, f"I weigh {w} kg and I'm {h} cm tall. What's my BMI?",
                                                   f"Calculate the BMI for {w} kilograms at {h} centimeters.")


@ask("calories_burned")
def _(rng):
    act, minutes = rng.choice(["running", "cycling", "swimming", "walking", "yoga"]), rng.choice([20, 30, 45, 60, 90])
    args: dict[str, Any] = {"activity": act, "minutes": minutes}
    who = ""
    if rng.random() < 0.5:
        args["weight_kg"] = rng.randint(50, 100)
        who = f" for someone weighing {args['weight_kg']} kg"
    return args, _pick(rng, f"How many calories does {minutes} minutes of {act} burn{who}?",
                       f"Estimate the calories burned by {act} for {minutes} minutes{who}.")


@ask("daily_water_intake")
def _(rng):
    w = rng.randint(45, 120)
    args: dict[str, Any] = {"weight_kg": w}
    act = ""
    if rng.random() < 0.5:
        args["activity_level"] = rng.choice(["low", "high"])
        act = f" with a {args['activity_level']} activity level"
    return args, _pick(rng, f"How much water should a {w} kg person drink a day{act}?",
                       f"Recommend a daily water intake for {w} kg{act}.")


@ask("describe_numbers")
def _(rng):
    numbers = [rng.randint(1, 100) for _ in range(rng.randint(4, 7))]
    listed = ", ".join(map(str, numbers))
    measure = rng.choice(["mean", "median", "stdev", "min", "max", "sum"])
    word = {"mean": "average", "median": "median", "stdev": "standard deviation", "min": "smallest value",
            "max": "largest value", "sum": "sum"}[measure]  # fmt: skip
    args: dict[str, Any] = {"numbers": numbers}
    if measure != "mean" or rng.random() < 0.5:
        args["measure"] = measure
    return args, _pick(rng, f"What is the {word} of {listed}?", f"Compute the {word} of these numbers: {listed}.")


@ask("greatest_common_divisor")
def _(rng):
    g = rng.randint(2, 60)
    a, b = g * rng.randint(2, 40), g * rng.randint(2, 40)
    return {"a": a, "b": b}, _pick(rng, f"What is the greatest common divisor of {a} and {b}?", f"Find gcd({a}, {b}).")


@ask("is_prime")
def _(rng):
    n = rng.randint(100, 99999)
    return {"n": n}, _pick(rng, f"Is {n} a prime number?", f"Check whether {n} is prime.")


@ask("factorial")
def _(rng):
    n = rng.randint(5, 25)
    return {"n": n}, _pick(rng, f"What is {n} factorial?", f"Compute the factorial of {n}.")


@ask("scale_recipe")
def _(rng):
    names = rng.sample(INGREDIENTS, rng.randint(2, 4))
    ingredients = {k: rng.choice([1, 2, 3, 4]) if k in ("eggs", "onions") else rng.choice([50, 100, 150, 200, 250, 500])
                   for k in names}  # fmt: skip
    servings, new = rng.sample([2, 4, 6, 8, 10, 12], 2)
    listed = ", ".join(f"{k} {v}" for k, v in ingredients.items())
    return {"ingredients": ingredients, "servings": servings, "new_servings": new}, _pick(
        rng, f"My recipe serves {servings} with {listed}. Scale it to {new} servings.",
        f"Rescale these quantities from {servings} to {new} servings: {listed}.")


@ask("cooking_time")
def _(rng):
    dish, w = rng.choice(["chicken", "beef", "pork", "salmon", "turkey"]), rng.choice([0.5, 1, 1.5, 2, 2.5, 3, 4, 5])
    args: dict[str, Any] = {"dish": dish, "weight_kg": w}
    done = ""
    if dish in ("beef", "salmon") and rng.random() < 0.6:
        args["doneness"] = rng.choice(["rare", "well_done"])
        done = f", {args['doneness'].replace('_', ' ')}"
    return args, _pick(rng, f"How long should I roast a {w} kg {dish}{done}?",
                       f"Oven time for {w} kg of {dish}{done}?")


# General requests that no catalogue function serves (the other irrelevance kind).
GENERAL = [
    "Who wrote {x}?", "Summarise the plot of {x} in two sentences.", "Why is {y} important in history?",
    "Write a short poem about {z}.", "Give me three fun facts about {z}.", "Explain what {w} means in simple words.",
    "Translate 'good morning, {n}' into Spanish.", "Tell me a joke about {z}.",
]  # fmt: skip
FILL = {
    "x": ["Pride and Prejudice", "Hamlet", "The Odyssey", "Don Quixote", "War and Peace", "Moby-Dick", "Dracula"],
    "y": ["the printing press", "the Silk Road", "the steam engine", "the Magna Carta", "penicillin"],
    "z": ["octopuses", "the moon", "volcanoes", "coffee", "penguins", "autumn", "the ocean", "honeybees"],
    "w": ["photosynthesis", "inflation", "machine learning", "entropy", "a black hole", "democracy"],
    "n": [p.capitalize() for p in PEOPLE],
}


def _general(rng: random.Random) -> str:
    template = rng.choice(GENERAL)
    return template.format(**{k: rng.choice(v) for k, v in FILL.items()})


# ---------------------------------------------------------------------------- gold


def acceptable_values(fn_name: str, args: dict[str, Any]) -> dict[str, list[Any]]:
    """BFCL possible-answer values of one call: each stated argument's value (and "" when it
    equals the default, so leaving it out is right too); "" and the default for an optional
    argument the request does not state. Dicts map each key to its own list, as BFCL's do."""
    params = inspect.signature(TOOLBOX.tools[fn_name].fn).parameters
    out: dict[str, list[Any]] = {}
    for name, param in params.items():
        default = param.default
        if name in args:
            value = args[name]
            if isinstance(value, dict):
                value = {k: [v] for k, v in value.items()}
            elif isinstance(value, list) and value and isinstance(value[0], dict):
                value = [{k: [v] for k, v in item.items()} for item in value]
            out[name] = [value] + ([""] if default is not inspect.Parameter.empty and args[name] == default else [])
        elif default is not inspect.Parameter.empty:
            out[name] = [""] if default is None else ["", default]
    return out


def run_calls(calls: list[ToolCall]) -> list[Any]:
    """Run catalogue calls directly; a call to an unknown function or one that raises gives an
    {"error": message} result instead of an output."""
    outputs = []
    for call in calls:
        tool = TOOLBOX.tools.get(call.name)
        try:
            if tool is None:
                raise ValueError(f"unknown function {call.name!r}")
            outputs.append(tool.fn(**call.arguments))
        except (TypeError, ValueError) as exc:
            outputs.append({"error": f"{type(exc).__name__}: {exc}"})
    return outputs


def execution_check(task: Task, calls: list[ToolCall], outputs: list[Any] | None = None) -> tuple[bool, str]:
    """(passed, reason): whether `calls` give the gold calls' results, in any order.

    outputs: what running `calls` gave, one per call (e.g. the sandbox's ToolResult outputs);
    None runs them here (`run_calls`). Irrelevance tasks pass with no call. A call outside the
    task's offered functions, an error, or a result the gold does not have fails."""
    offered = {t.name for t in task.tools}
    outside = [c.name for c in calls if c.name not in offered]
    if outside:
        return False, f"called {outside[0]!r}, which the task does not offer"
    got = run_calls(calls) if outputs is None else list(outputs)
    if len(got) != len(calls):
        raise ValueError(f"execution_check: {len(got)} outputs for {len(calls)} calls")
    errors = [o["error"] for o in got if isinstance(o, dict) and set(o) == {"error"}]
    if errors:
        return False, errors[0]
    want = task.metadata["gold_results"]
    if Counter(canonical_json(o) for o in got) == Counter(canonical_json(o) for o in want):
        return True, ""
    if len(calls) != len(want):
        return False, f"{len(calls)} calls instead of {len(want)}"
    return False, "the results differ from the gold calls' results"


# ---------------------------------------------------------------------------- drafts

JOINS = ("{a} {b}", "{a} Also: {b}", "Two things. First: {a} Second: {b}", "{a} And one more: {b}")
JOINS3 = ("{a} {b} {c}", "A few requests. 1) {a} 2) {b} 3) {c}", "{a} Also: {b} Finally: {c}")


def _join(rng: random.Random, texts: list[str]) -> str:
    if len(texts) == 2:
        return rng.choice(JOINS).format(a=texts[0], b=texts[1])
    return rng.choice(JOINS3).format(a=texts[0], b=texts[1], c=texts[2])


# Functions of different domains that can still serve each other's requests (a sum of numbers is a
# polygon's perimeter): never an irrelevance task's only offer for the other's request.
OVERLAPS = ({"describe_numbers", "polygon_perimeter"}, {"get_distance", "point_distance"})


def _others(domains: set[str], targets: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Functions outside `domains`, less those that overlap with a target."""
    near = {n for pair in OVERLAPS if pair & set(targets) for n in pair}
    return [fn.__name__ for d, fns in DOMAINS.items() if d not in domains for fn in fns if fn.__name__ not in near]


def _draw_asks(rng: random.Random, fn_name: str, n: int) -> list[tuple[dict[str, Any], str]]:
    """n requests of one function with distinct arguments."""
    out: list[tuple[dict[str, Any], str]] = []
    seen: set[str] = set()
    while len(out) < n:
        args, text = ASKS[fn_name](rng)
        key = canonical_json(args)
        if key not in seen:
            seen.add(key)
            out.append((args, text))
    return out


def draft(rng: random.Random) -> Draft:
    """One request of a random kind, its offered functions and BFCL-style gold."""
    kind = rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
    names = list(ASKS)
    targets: list[str]
    if kind == "parallel_multiple":
        targets = rng.sample(names, rng.randint(2, 3))
    else:
        targets = [rng.choice(names)]
    domains = {DOMAIN_OF[t] for t in targets}
    if kind == "irrelevance":
        # The request names a function that is not offered; or it is a general question.
        general = rng.random() < 0.3
        offered = rng.sample(_others(domains, targets), rng.randint(2, 5))
        question = _general(rng) if general else ASKS[targets[0]](rng)[1]
        requests: list[tuple[str, dict[str, Any]]] = []
    else:
        if kind == "parallel":
            asks = _draw_asks(rng, targets[0], rng.randint(2, 3))
            requests = [(targets[0], a) for a, _ in asks]
            question = _join(rng, [t for _, t in asks])
        else:
            asks = [ASKS[t](rng) for t in targets]
            requests = [(t, a) for t, (a, _) in zip(targets, asks)]
            question = asks[0][1] if len(asks) == 1 else _join(rng, [t for _, t in asks])
        if kind == "multiple":
            same = [fn.__name__ for fn in DOMAINS[DOMAIN_OF[targets[0]]] if fn.__name__ != targets[0]]
            distractors = rng.sample(same, min(len(same), rng.randint(1, 3)))
            distractors += rng.sample(_others(domains), rng.randint(0, 4 - len(distractors)))
        else:
            n_max = 5 - len(targets)
            distractors = rng.sample(_others(domains), rng.randint(1 if len(targets) < 3 else 0, min(3, n_max)))
        offered = targets + distractors
    calls = [ToolCall(name=n, arguments=a) for n, a in requests]
    results = run_calls(calls)
    if any(isinstance(r, dict) and set(r) == {"error"} for r in results):
        raise ValueError(f"fncall drafted a gold call that fails: {calls} -> {results}")
    order = [name for name in TOOLBOX.tools if name in set(offered)]
    gold = Gold(
        calls=calls,
        acceptable=[acceptable_values(n, a) for n, a in requests],
        needs_tool=bool(calls),
    )
    level = LEVEL[kind]
    return Draft(
        question=question,
        key=f"{kind}|{','.join(order)}|{question}",
        gold=gold,
        metadata={
            "level": level,
            "difficulty": level,
            "kind": kind,
            "n_steps": len(calls),
            "functions": [c.name for c in calls],
            "domains": sorted({DOMAIN_OF[n] for n in offered}),
            "gold_results": results,
            **({"gold_reply": IRRELEVANT_REPLY} if kind == "irrelevance" else {}),
        },
        offered=tuple(order),
        split_key=" ".join(question.split()),
    )


SUITE = Suite(
    name="fncall",
    description="Function calling over 54 realistic functions: irrelevance, simple, multiple, parallel and "
                "parallel_multiple requests, judged by BFCL's AST rules and by execution.",
    toolbox=TOOLBOX,
    draft=draft,
    levels=tuple(LEVEL.values()),
)
