"""Chains suite: questions that need 2-4 dependent lookups in a fictional world.

The world (countries, cities, mayors, currencies, languages, airports, trading partners, twin
cities) is generated once from a fixed seed, so its facts are the same in every process and no
model knows them from pretraining: the only way to the answer is through the tools. Each tool maps one kind of
entity to another (city -> country -> currency -> exchange rate); the tools form a networkx
DiGraph with an edge u -> v when u's output kind is v's input kind, and a task is a random path
in that graph from a named entity. Gold call i+1 takes the real output of gold call i.

Level (metadata["level"]) = number of gold calls - 1: 1, 2 or 3 for paths of 2, 3 or 4 lookups.
Problem key: "<start entity>|<tool>>...>"; both phrasings of a question spell out the start and
every step, so equal questions have equal keys.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from dataengine.suites.base import Draft, Suite, format_number, make_toolbox
from dataengine.tools.registry import register_toolbox
from dataengine.types import Gold, ToolCall

if TYPE_CHECKING:
    import networkx as nx

WORLD_SEED = "chains-world-v1"
N_COUNTRIES = 30
CITIES_PER_COUNTRY = 5
N_LANGUAGES = 12
CONTINENTS = ["Africa", "Asia", "Europe", "North America", "Oceania", "South America"]
SYLLABLES = ["ka", "lo", "mer", "va", "dri", "sol", "ten", "bar", "qui", "nor", "ez", "ul", "tha", "ro", "vin",
             "sa", "mol", "ket", "ari", "dun", "pel", "os", "ga", "fen", "ri", "zo", "lan", "ver", "ish", "tor"]  # fmt: skip


@dataclass(frozen=True)
class World:
    """The fictional facts every chains tool reads (dicts keyed by lower-case name)."""

    countries: dict[str, dict[str, Any]]
    cities: dict[str, dict[str, Any]]
    people: dict[str, dict[str, Any]]
    currencies: dict[str, dict[str, Any]]
    languages: dict[str, dict[str, Any]]
    airports: dict[str, dict[str, Any]]


def _build_world() -> World:
    rng = random.Random(WORLD_SEED)
    taken: set[str] = set()

    def word(n_low: int, n_high: int, suffix: str = "") -> str:
        while True:
            text = ("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(n_low, n_high))) + suffix).capitalize()
            if text.lower() not in taken and len(text) <= 12:
                taken.add(text.lower())
                return text

    def code(n: int) -> str:
        while True:
            text = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(n))
            if text.lower() not in taken:
                taken.add(text.lower())
                return text

    languages = {}
    for _ in range(N_LANGUAGES):
        name = word(2, 2, "ic")
        languages[name.lower()] = {"name": name, "greeting": word(2, 3).lower()}
    countries, cities, people, currencies, airports = {}, {}, {}, {}, {}
    for _ in range(N_COUNTRIES):
        country = word(2, 3, rng.choice(["ia", "land", "ova", "istan"]))
        currency = code(3)
        currencies[currency.lower()] = {"code": currency, "usd_rate": round(rng.uniform(0.01, 5.0), 4)}
        names = [word(2, 3) for _ in range(CITIES_PER_COUNTRY)]
        countries[country.lower()] = {
            "name": country,
            "capital": names[0],
            "currency": currency,
            "language": rng.choice(sorted(languages.values(), key=lambda x: x["name"]))["name"],
            "continent": rng.choice(CONTINENTS),
        }
        for i, city in enumerate(names):
            airport = code(3)
            airports[airport.lower()] = {"code": airport, "elevation_m": rng.randint(0, 2500)}
            mayor = f"{word(1, 2)} {word(2, 3)}"
            people[mayor.lower()] = {"name": mayor}
            population = rng.randint(200_000, 9_000_000) if i == 0 else rng.randint(5_000, 900_000)
            cities[city.lower()] = {"name": city, "country": country, "population": population,
                                    "mayor": mayor, "airport": airport}  # fmt: skip
    city_names = sorted(c["name"] for c in cities.values())
    for person in people.values():
        person["birth_city"] = rng.choice(city_names)
    country_names = sorted(c["name"] for c in countries.values())
    for country in countries.values():
        country["trade_partner"] = rng.choice([n for n in country_names if n != country["name"]])
    for city in cities.values():
        city["twin_city"] = rng.choice([n for n in city_names if cities[n.lower()]["country"] != city["country"]])
    return World(countries, cities, people, currencies, languages, airports)


WORLD = _build_world()


def _find(table: dict[str, dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    if not isinstance(name, str) or name.strip().lower() not in table:
        raise ValueError(f"unknown {kind} {name!r}")
    return table[name.strip().lower()]


def city_country(city: str) -> str:
    """Look up the country a city is in.

    Args:
        city: The city name.

    Returns:
        The country name.
    """
    return _find(WORLD.cities, "city", city)["country"]


def country_capital(country: str) -> str:
    """Look up the capital city of a country.

    Args:
        country: The country name.

    Returns:
        The name of the capital city.
    """
    return _find(WORLD.countries, "country", country)["capital"]


def country_currency(country: str) -> str:
    """Look up the currency used in a country.

    Args:
        country: The country name.

    Returns:
        The three-letter currency code.
    """
    return _find(WORLD.countries, "country", country)["currency"]


def exchange_rate_to_usd(currency: str) -> float:
    """Look up how many US dollars one unit of a currency is worth.

    Args:
        currency: The three-letter currency code.

    Returns:
        The value of one unit of the currency in US dollars.
    """
    return _find(WORLD.currencies, "currency", currency)["usd_rate"]


def country_language(country: str) -> str:
    """Look up the main language spoken in a country.

    Args:
        country: The country name.

    Returns:
        The language name.
    """
    return _find(WORLD.countries, "country", country)["language"]


def language_greeting(language: str) -> str:
    """Look up the word for "hello" in a language.

    Args:
        language: The language name.

    Returns:
        The greeting word.
    """
    return _find(WORLD.languages, "language", language)["greeting"]


def country_continent(country: str) -> str:
    """Look up the continent a country is on.

    Args:
        country: The country name.

    Returns:
        The continent name.
    """
    return _find(WORLD.countries, "country", country)["continent"]


def country_trade_partner(country: str) -> str:
    """Look up the main trading partner of a country.

    Args:
        country: The country name.

    Returns:
        The name of the partner country.
    """
    return _find(WORLD.countries, "country", country)["trade_partner"]


def city_twin_city(city: str) -> str:
    """Look up the twin city of a city (a partner city in another country).

    Args:
        city: The city name.

    Returns:
        The name of the twin city.
    """
    return _find(WORLD.cities, "city", city)["twin_city"]


def city_population(city: str) -> int:
    """Look up the population of a city.

    Args:
        city: The city name.

    Returns:
        The number of inhabitants.
    """
    return _find(WORLD.cities, "city", city)["population"]


def city_mayor(city: str) -> str:
    """Look up the mayor of a city.

    Args:
        city: The city name.

    Returns:
        The mayor's full name.
    """
    return _find(WORLD.cities, "city", city)["mayor"]


def person_birth_city(person: str) -> str:
    """Look up the city a person was born in.

    Args:
        person: The person's full name.

    Returns:
        The name of the birth city.
    """
    return _find(WORLD.people, "person", person)["birth_city"]


def city_airport(city: str) -> str:
    """Look up the code of the main airport of a city.

    Args:
        city: The city name.

    Returns:
        The three-letter airport code.
    """
    return _find(WORLD.cities, "city", city)["airport"]


def airport_elevation(airport: str) -> int:
    """Look up the elevation of an airport.

    Args:
        airport: The three-letter airport code.

    Returns:
        The elevation in meters above sea level.
    """
    return _find(WORLD.airports, "airport", airport)["elevation_m"]


@dataclass(frozen=True)
class Link:
    """How a tool reads: input kind -> output kind, a nested noun phrase and a step phrase."""

    input: str
    output: str
    noun: str  # "{x}" is the phrase of the input
    step: str  # refers to the previous result as "it"


LINKS: dict[str, Link] = {
    "city_country": Link("city", "country", "the country where {x} lies", "find the country it is in"),
    "country_capital": Link("country", "city", "the capital of {x}", "find its capital"),
    "country_currency": Link("country", "currency", "the currency of {x}", "find its currency"),
    "exchange_rate_to_usd": Link("currency", "number", "the value in US dollars of one unit of {x}",
                                 "find what one unit of it is worth in US dollars"),
    "country_language": Link("country", "language", "the main language of {x}", "find its main language"),
    "language_greeting": Link("language", "word", 'the word for "hello" in {x}', 'find the word for "hello" in it'),
    "country_continent": Link("country", "continent", "the continent of {x}", "find its continent"),
    "country_trade_partner": Link("country", "country", "the main trading partner of {x}",
                                  "find its main trading partner"),
    "city_twin_city": Link("city", "city", "the twin city of {x}", "find its twin city"),
    "city_population": Link("city", "number", "the population of {x}", "find its population"),
    "city_mayor": Link("city", "person", "the mayor of {x}", "find its mayor"),
    "person_birth_city": Link("person", "city", "the birth city of {x}", "find the city where that person was born"),
    "city_airport": Link("city", "airport", "the airport code of {x}", "find its airport code"),
    "airport_elevation": Link("airport", "number", "the elevation in meters of {x}", "find its elevation in meters"),
}  # fmt: skip
FUNCTIONS = {
    fn.__name__: fn
    for fn in [
        city_country, country_capital, country_currency, exchange_rate_to_usd, country_language,
        language_greeting, country_continent, country_trade_partner, city_twin_city, city_population,
        city_mayor, person_birth_city, city_airport, airport_elevation,
    ]
}
# Edges that only undo the previous step (the country of the capital of X is X).
TRIVIAL_EDGES = {("country_capital", "city_country")}
# How a starting entity of each kind is named in a question.
ENTITY_PHRASE = {
    "city": "the city {}",
    "country": "{}",
    "person": "{}",
    "currency": "the currency {}",
    "language": "the {} language",
    "airport": "the airport {}",
}
MIN_CALLS, MAX_CALLS = 2, 4
# Tools shown per task: the path's tools plus random distractors. All 14 schemas would make a
# ~1,000-token system prompt; 6 keep the "which tool" choice real at less than half that.
OFFERED_TOOLS = 6

TOOLBOX = register_toolbox(make_toolbox("chains", list(FUNCTIONS.values())))


@lru_cache(maxsize=1)
def tool_graph() -> nx.DiGraph:
    """Tool-dependency graph: a node per tool (attributes input, output), an edge u -> v when
    u's output kind is v's input kind (minus TRIVIAL_EDGES)."""
    import networkx as nx

    graph = nx.DiGraph()
    for name, link in LINKS.items():
        graph.add_node(name, input=link.input, output=link.output)
    for u, lu in LINKS.items():
        for v, lv in LINKS.items():
            if u != v and lu.output == lv.input and (u, v) not in TRIVIAL_EDGES:
                graph.add_edge(u, v)
    return graph


def random_path(rng: random.Random, length: int) -> list[str] | None:
    """A simple path of `length` tools, each feeding the next; None if the walk gets stuck."""
    graph = tool_graph()
    path = [rng.choice(sorted(graph.nodes))]
    while len(path) < length:
        nexts = sorted(n for n in graph.successors(path[-1]) if n not in path)
        if not nexts:
            return None
        path.append(rng.choice(nexts))
    return path


def _entities(kind: str) -> list[str]:
    tables = {"city": WORLD.cities, "country": WORLD.countries, "person": WORLD.people,
              "currency": WORLD.currencies, "language": WORLD.languages, "airport": WORLD.airports}  # fmt: skip
    key = "code" if kind in ("currency", "airport") else "name"
    return sorted(row[key] for row in tables[kind].values())


def _phrase(rng: random.Random, path: list[str], start: str) -> tuple[str, str]:
    first = ENTITY_PHRASE[LINKS[path[0]].input].format(start)
    if rng.random() < 0.5:
        text = first
        for name in path:
            text = LINKS[name].noun.format(x=text)
        wh = "Who" if LINKS[path[-1]].output == "person" else "What"
        return "nested", f"{wh} is {text}?"
    steps = [LINKS[name].step for name in path]
    return "steps", f"Start from {first}: {', then '.join(steps)}. What is the final result?"


def draft(rng: random.Random) -> Draft:
    """One random path from a random named entity; gold calls chain the real tool outputs."""
    while True:
        path = random_path(rng, rng.randint(MIN_CALLS, MAX_CALLS))
        if path is not None:
            break
    start = rng.choice(_entities(LINKS[path[0]].input))
    calls: list[ToolCall] = []
    value: Any = start
    for name in path:
        (param,) = TOOLBOX.tools[name].spec.parameters["properties"]
        calls.append(ToolCall(name=name, arguments={param: value}))
        value = FUNCTIONS[name](value)
    template, question = _phrase(rng, path, start)
    answer = format_number(value) if isinstance(value, (int, float)) else str(value)
    others = sorted(set(FUNCTIONS) - set(path))
    offered = set(path) | set(rng.sample(others, max(0, OFFERED_TOOLS - len(path))))
    return Draft(
        question=question,
        key=f"{start}|{'>'.join(path)}",
        offered=tuple(name for name in FUNCTIONS if name in offered),
        gold=Gold(answer=answer, calls=calls, needs_tool=True),
        metadata={
            "level": len(path) - MIN_CALLS + 1,
            "difficulty": len(path),
            "n_steps": len(path),
            "template": template,
            "path": path,
            "answer_rel_tol": 0.0,
        },
    )


SUITE = Suite(
    name="chains",
    description="2-4 dependent lookups in a fictional world (city -> country -> currency -> rate ...), paths in a tool graph.",
    toolbox=TOOLBOX,
    draft=draft,
)
