"""The `fncall` toolbox: a catalogue of realistic functions over ten domains that really run.

Every function is pure, deterministic and bounded (no clock, network or randomness: services
such as weather, flights or stock quotes are simulated from a hash of their arguments), so a
call can be judged by executing it as well as by its arguments. Schemas come from the type
hints and docstrings (`make_toolbox`): Literal enums, optional arguments with defaults, lists,
dicts and lists of dicts. Bad input raises ValueError with a message naming the argument.

DOMAINS maps each domain to its function names (the suite picks distractors by domain).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import statistics
from typing import Any, Literal

from dataengine.suites.base import make_toolbox
from dataengine.tools.registry import register_toolbox

# City -> (latitude, longitude, country, UTC offset in hours, standard time).
CITIES: dict[str, tuple[float, float, str, float]] = {
    "Paris": (48.8566, 2.3522, "France", 1), "London": (51.5074, -0.1278, "United Kingdom", 0),
    "New York": (40.7128, -74.006, "United States", -5), "Tokyo": (35.6762, 139.6503, "Japan", 9),
    "Sydney": (-33.8688, 151.2093, "Australia", 10), "Berlin": (52.52, 13.405, "Germany", 1),
    "Madrid": (40.4168, -3.7038, "Spain", 1), "Rome": (41.9028, 12.4964, "Italy", 1),
    "Toronto": (43.6532, -79.3832, "Canada", -5), "Chicago": (41.8781, -87.6298, "United States", -6),
    "San Francisco": (37.7749, -122.4194, "United States", -8), "Mumbai": (19.076, 72.8777, "India", 5.5),
    "Singapore": (1.3521, 103.8198, "Singapore", 8), "Dubai": (25.2048, 55.2708, "United Arab Emirates", 4),
    "Cairo": (30.0444, 31.2357, "Egypt", 2), "Mexico City": (19.4326, -99.1332, "Mexico", -6),
    "Sao Paulo": (-23.5505, -46.6333, "Brazil", -3), "Seoul": (37.5665, 126.978, "South Korea", 9),
    "Amsterdam": (52.3676, 4.9041, "Netherlands", 1), "Istanbul": (41.0082, 28.9784, "Turkey", 3),
    "Bangkok": (13.7563, 100.5018, "Thailand", 7), "Cape Town": (-33.9249, 18.4241, "South Africa", 2),
    "Buenos Aires": (-34.6037, -58.3816, "Argentina", -3), "Lisbon": (38.7223, -9.1393, "Portugal", 0),
}  # fmt: skip
Currency = Literal["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "INR"]
# Value of one unit in US dollars (a fixed table: the simulated market never moves).
USD_PER: dict[str, float] = {"USD": 1.0, "EUR": 1.08, "GBP": 1.27, "JPY": 0.0067, "CHF": 1.13, "CAD": 0.74,
                             "AUD": 0.66, "INR": 0.012}  # fmt: skip
LengthUnit = Literal["mm", "cm", "m", "km", "in", "ft", "yd", "mi"]
LENGTH_M = {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "in": 0.0254, "ft": 0.3048, "yd": 0.9144, "mi": 1609.344}
WeightUnit = Literal["mg", "g", "kg", "t", "oz", "lb"]
WEIGHT_KG = {"mg": 1e-6, "g": 0.001, "kg": 1.0, "t": 1000.0, "oz": 0.028349523125, "lb": 0.45359237}
VolumeUnit = Literal["ml", "l", "fl_oz", "cup", "pint", "quart", "gallon"]
VOLUME_L = {"ml": 0.001, "l": 1.0, "fl_oz": 0.0295735295625, "cup": 0.2365882365, "pint": 0.473176473,
            "quart": 0.946352946, "gallon": 3.785411784}  # fmt: skip
SpeedUnit = Literal["kmh", "mph", "ms", "knots"]
SPEED_MS = {"kmh": 1 / 3.6, "mph": 0.44704, "ms": 1.0, "knots": 0.514444}
Scale = Literal["celsius", "fahrenheit", "kelvin"]
CONDITIONS = ("sunny", "partly cloudy", "cloudy", "light rain", "heavy rain", "windy", "foggy")
# Income tax: (threshold, marginal rate) brackets per country, single filer; married doubles thresholds.
TAX_BRACKETS: dict[str, list[tuple[float, float]]] = {
    "US": [(0, 0.10), (11_600, 0.12), (47_150, 0.22), (100_525, 0.24), (191_950, 0.32)],
    "UK": [(0, 0.0), (12_570, 0.20), (50_270, 0.40), (125_140, 0.45)],
    "DE": [(0, 0.0), (11_604, 0.14), (66_761, 0.42), (277_826, 0.45)],
    "FR": [(0, 0.0), (11_294, 0.11), (28_797, 0.30), (82_341, 0.41), (177_106, 0.45)],
    "CA": [(0, 0.15), (55_867, 0.205), (111_733, 0.26), (173_205, 0.29)],
    "AU": [(0, 0.0), (18_200, 0.16), (45_000, 0.30), (135_000, 0.37), (190_000, 0.45)],
}
MET = {"running": 9.8, "cycling": 7.5, "swimming": 8.0, "walking": 3.5, "yoga": 2.5}  # kcal per kg per hour
SHIPPING_SPEED = {"standard": (1.0, 6), "express": (1.8, 3), "overnight": (3.2, 1)}  # (price factor, days)
# Biggest inputs the functions accept (they stay bounded in time and output size).
MAX_TEXT = 5000
MAX_ITEMS = 100


def _unit(*parts: Any) -> float:
    """A stable pseudo-random number in [0, 1) from the arguments (the simulated services' data)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _key(text: str) -> str:
    return " ".join(text.split()).casefold()


_CITY_KEYS = {_key(name): name for name in CITIES}


def _city(city: str, label: str = "city") -> str:
    if not isinstance(city, str) or _key(city) not in _CITY_KEYS:
        raise ValueError(f"unknown {label} {city!r}; known cities: {', '.join(CITIES)}")
    return _CITY_KEYS[_key(city)]


def _date(date: str, label: str = "date") -> dt.date:
    try:
        return dt.date.fromisoformat(date)
    except (TypeError, ValueError):
        raise ValueError(f"{label} must be a date as YYYY-MM-DD, got {date!r}") from None


def _time(text: str, label: str = "time") -> int:
    """Minutes after midnight of "HH:MM"."""
    try:
        hours, minutes = text.split(":")
        h, m = int(hours), int(minutes)
    except (AttributeError, ValueError):
        raise ValueError(f"{label} must be a 24-hour time as HH:MM, got {text!r}") from None
    if not (0 <= h < 24 and 0 <= m < 60):
        raise ValueError(f"{label} must be a 24-hour time as HH:MM, got {text!r}")
    return 60 * h + m


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60 % 24:02d}:{minutes % 60:02d}"


def _number(value: Any, label: str, *, low: float | None = None, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{label} must be a finite number, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{label} must be between {low} and {high}, got {value!r}")
    return float(value)


def _count(value: Any, label: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{label} must be an integer from {low} to {high}, got {value!r}")
    return value


def _choice(value: Any, label: str, allowed: Any) -> str:
    if value not in allowed:
        raise ValueError(f"{label} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _text(value: Any, label: str = "text") -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"{label} must be a string of at most {MAX_TEXT} characters")
    return value


def _r(x: float, digits: int = 2) -> float:
    return round(x, digits) + 0.0  # + 0.0 turns -0.0 into 0.0


def _temperature(celsius: float, unit: str) -> float:
    return _r(celsius * 9 / 5 + 32 if unit == "fahrenheit" else celsius, 1)


def _haversine_km(a: str, b: str) -> float:
    lat1, lon1, *_ = CITIES[a]
    lat2, lon2, *_ = CITIES[b]
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * 6371.0 * math.asin(math.sqrt(h))


# ---------------------------------------------------------------------------- weather


def get_current_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict:
    """Get the current weather in a city.

    Args:
        city: The city name, e.g. "Paris".
        unit: The temperature unit of the result.

    Returns:
        The temperature, the sky condition and the relative humidity in percent.
    """
    name = _city(city)
    _choice(unit, "unit", ("celsius", "fahrenheit"))
    celsius = 28 - abs(CITIES[name][0]) * 0.35 + 10 * _unit("now", name)
    return {"city": name, "temperature": _temperature(celsius, unit), "unit": unit,
            "condition": CONDITIONS[int(_unit("sky", name) * len(CONDITIONS))],
            "humidity": 30 + int(60 * _unit("humidity", name))}  # fmt: skip


def get_weather_forecast(city: str, days: int = 3, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict:
    """Get the daily weather forecast for a city.

    Args:
        city: The city name, e.g. "Tokyo".
        days: How many days ahead to forecast, from 1 to 7.
        unit: The temperature unit of the result.

    Returns:
        One entry per day with the high and low temperatures and the sky condition.
    """
    name = _city(city)
    _count(days, "days", 1, 7)
    _choice(unit, "unit", ("celsius", "fahrenheit"))
    out = []
    for day in range(1, days + 1):
        high = 30 - abs(CITIES[name][0]) * 0.35 + 8 * _unit("high", name, day)
        low = high - 4 - 8 * _unit("low", name, day)
        out.append({"day": day, "high": _temperature(high, unit), "low": _temperature(low, unit),
                    "condition": CONDITIONS[int(_unit("sky", name, day) * len(CONDITIONS))]})  # fmt: skip
    return {"city": name, "unit": unit, "forecast": out}


def get_air_quality(city: str, pollutant: Literal["pm25", "pm10", "ozone", "no2"] = "pm25") -> dict:
    """Get the current air quality of a city for one pollutant.

    Args:
        city: The city name.
        pollutant: Which pollutant to measure: fine particles (pm25), coarse particles (pm10), ozone or nitrogen dioxide (no2).

    Returns:
        The concentration in micrograms per cubic meter and its category (good, moderate, unhealthy).
    """
    name = _city(city)
    _choice(pollutant, "pollutant", ("pm25", "pm10", "ozone", "no2"))
    value = _r(5 + 95 * _unit("air", name, pollutant), 1)
    category = "good" if value < 35 else "moderate" if value < 70 else "unhealthy"
    return {"city": name, "pollutant": pollutant, "value": value, "category": category}


def get_sunrise_sunset(city: str, date: str) -> dict:
    """Get the sunrise and sunset times of a city on a date, in local standard time.

    Args:
        city: The city name.
        date: The date as YYYY-MM-DD.

    Returns:
        The sunrise and sunset times as HH:MM and the day length in minutes.
    """
    name = _city(city)
    day = _date(date).timetuple().tm_yday
    lat, lon, _, offset = CITIES[name]
    declination = math.radians(23.44) * math.sin(2 * math.pi * (284 + day) / 365)
    cos_h = -math.tan(math.radians(lat)) * math.tan(declination)
    half = math.degrees(math.acos(max(-1.0, min(1.0, cos_h)))) / 15 * 60
    noon = 12 * 60 - (lon / 15 - offset) * 60
    return {"city": name, "date": date, "sunrise": _hhmm(round(noon - half)), "sunset": _hhmm(round(noon + half)),
            "day_length_minutes": round(2 * half)}  # fmt: skip


# ---------------------------------------------------------------------------- finance


def convert_currency(amount: float, from_currency: Currency, to_currency: Currency) -> dict:
    """Convert an amount of money from one currency to another at today's rate.

    Args:
        amount: The amount of money, in from_currency.
        from_currency: The ISO code of the currency the amount is in.
        to_currency: The ISO code of the currency to convert to.

    Returns:
        The converted amount (2 decimals), its currency and the rate used.
    """
    value = _number(amount, "amount", low=0, high=1e12)
    _choice(from_currency, "from_currency", USD_PER)
    _choice(to_currency, "to_currency", USD_PER)
    rate = USD_PER[from_currency] / USD_PER[to_currency]
    return {"amount": _r(value * rate), "currency": to_currency, "rate": _r(rate, 6)}


def compound_interest(principal: float, annual_rate: float, years: int, compounds_per_year: int = 12) -> dict:
    """Compute the value of a savings deposit with compound interest.

    Args:
        principal: The amount deposited.
        annual_rate: The yearly interest rate in percent, e.g. 4.5 for 4.5%.
        years: How many years the money stays deposited.
        compounds_per_year: How many times a year interest is added (1 yearly, 4 quarterly, 12 monthly).

    Returns:
        The final amount and the interest earned, both with 2 decimals.
    """
    p = _number(principal, "principal", low=0, high=1e12)
    rate = _number(annual_rate, "annual_rate", low=0, high=100) / 100
    n = _count(compounds_per_year, "compounds_per_year", 1, 365)
    final = p * (1 + rate / n) ** (n * _count(years, "years", 0, 100))
    return {"final_amount": _r(final), "interest_earned": _r(final - p)}


def loan_monthly_payment(principal: float, annual_rate: float, months: int) -> dict:
    """Compute the fixed monthly payment of an amortised loan.

    Args:
        principal: The amount borrowed.
        annual_rate: The yearly interest rate in percent.
        months: The number of monthly payments.

    Returns:
        The monthly payment, the total paid and the total interest, with 2 decimals.
    """
    p = _number(principal, "principal", low=0, high=1e12)
    r = _number(annual_rate, "annual_rate", low=0, high=100) / 1200
    n = _count(months, "months", 1, 600)
    payment = p / n if r == 0 else p * r / (1 - (1 + r) ** -n)
    return {"monthly_payment": _r(payment), "total_paid": _r(payment * n), "total_interest": _r(payment * n - p)}


def get_stock_price(symbol: str, exchange: Literal["NASDAQ", "NYSE", "LSE", "TSE"] = "NASDAQ") -> dict:
    """Get the latest price of a stock.

    Args:
        symbol: The ticker symbol, e.g. "AAPL".
        exchange: The stock exchange the symbol is listed on.

    Returns:
        The symbol, the exchange, the price and the currency of the price.
    """
    _choice(exchange, "exchange", ("NASDAQ", "NYSE", "LSE", "TSE"))
    if not isinstance(symbol, str) or not symbol.strip().isalnum() or len(symbol.strip()) > 6:
        raise ValueError(f"symbol must be a ticker of 1-6 letters or digits, got {symbol!r}")
    ticker = symbol.strip().upper()
    currency = {"LSE": "GBP", "TSE": "JPY"}.get(exchange, "USD")
    scale = 100.0 if currency == "JPY" else 1.0
    return {"symbol": ticker, "exchange": exchange, "price": _r((20 + 480 * _unit("stock", ticker)) * scale),
            "currency": currency}  # fmt: skip


def portfolio_value(holdings: dict[str, float], currency: Currency = "USD") -> dict:
    """Value a portfolio of NASDAQ stocks at the latest prices.

    Args:
        holdings: Number of shares held per ticker symbol, e.g. {"AAPL": 10, "MSFT": 4}.
        currency: The currency to value the portfolio in.

    Returns:
        The value of each position and the total, with 2 decimals, in the requested currency.
    """
    if not isinstance(holdings, dict) or not 1 <= len(holdings) <= MAX_ITEMS:
        raise ValueError(f"holdings must map 1 to {MAX_ITEMS} ticker symbols to share counts")
    _choice(currency, "currency", USD_PER)
    positions = {}
    for symbol, shares in holdings.items():
        n = _number(shares, f"holdings[{symbol!r}]", low=0, high=1e9)
        quote = get_stock_price(symbol)
        positions[quote["symbol"]] = _r(n * quote["price"] / USD_PER[currency])
    return {"positions": positions, "total": _r(sum(positions.values())), "currency": currency}


def split_bill(total: float, people: int, tip_percent: float = 15.0) -> dict:
    """Split a restaurant bill evenly, tip included.

    Args:
        total: The bill before the tip.
        people: How many people share the bill.
        tip_percent: The tip in percent of the bill.

    Returns:
        The tip, the total with the tip and the amount each person pays, with 2 decimals.
    """
    bill = _number(total, "total", low=0, high=1e9)
    n = _count(people, "people", 1, 1000)
    tip = bill * _number(tip_percent, "tip_percent", low=0, high=100) / 100
    return {"tip": _r(tip), "total_with_tip": _r(bill + tip), "per_person": _r((bill + tip) / n)}


def income_tax(income: float, country: Literal["US", "UK", "DE", "FR", "CA", "AU"],
               filing_status: Literal["single", "married"] = "single") -> dict:  # fmt: skip
    """Estimate the yearly national income tax from simplified tax brackets.

    Args:
        income: The taxable yearly income in the country's currency.
        country: The country's two-letter code.
        filing_status: Filing alone or jointly as a married couple (joint filing doubles the brackets).

    Returns:
        The tax, the effective rate in percent and the income after tax, with 2 decimals.
    """
    value = _number(income, "income", low=0, high=1e12)
    _choice(country, "country", TAX_BRACKETS)
    factor = 2 if _choice(filing_status, "filing_status", ("single", "married")) == "married" else 1
    brackets = TAX_BRACKETS[country]
    tax = 0.0
    for i, (low, rate) in enumerate(brackets):
        high = brackets[i + 1][0] * factor if i + 1 < len(brackets) else math.inf
        tax += max(0.0, min(value, high) - low * factor) * rate
    return {"tax": _r(tax), "effective_rate": _r(100 * tax / value) if value else 0.0, "after_tax": _r(value - tax)}


# ---------------------------------------------------------------------------- travel


def search_flights(origin: str, destination: str, date: str,
                   cabin: Literal["economy", "premium_economy", "business", "first"] = "economy",
                   max_stops: int = 1) -> dict:  # fmt: skip
    """Search the flights between two cities on a date.

    Args:
        origin: The departure city.
        destination: The arrival city.
        date: The departure date as YYYY-MM-DD.
        cabin: The cabin class.
        max_stops: The most stops a flight may make (0 for direct flights only).

    Returns:
        The matching flights (flight number, departure time, stops, price in USD), cheapest first.
    """
    a, b = _city(origin, "origin"), _city(destination, "destination")
    if a == b:
        raise ValueError("origin and destination must be different cities")
    _date(date)
    factor = {"economy": 1.0, "premium_economy": 1.6, "business": 3.2, "first": 5.0}[
        _choice(cabin, "cabin", ("economy", "premium_economy", "business", "first"))]
    _count(max_stops, "max_stops", 0, 3)
    km = _haversine_km(a, b)
    flights = []
    for i in range(4):
        stops = int(3 * _unit("stops", a, b, date, i))
        if stops > max_stops:
            continue
        price = (60 + 0.09 * km * (1.15 - 0.1 * stops)) * (0.8 + 0.5 * _unit("fare", a, b, date, i)) * factor
        flights.append({"flight": f"{a[:2].upper()}{100 + int(900 * _unit('no', a, b, date, i))}",
                        "departure": _hhmm(6 * 60 + int(15 * 60 * _unit("dep", a, b, date, i)) // 5 * 5),
                        "stops": stops, "price_usd": _r(price)})  # fmt: skip
    return {"origin": a, "destination": b, "date": date, "cabin": cabin,
            "flights": sorted(flights, key=lambda f: (f["price_usd"], f["flight"]))}  # fmt: skip


def book_hotel(city: str, check_in: str, nights: int, guests: int = 1,
               room_type: Literal["single", "double", "suite"] = "double") -> dict:  # fmt: skip
    """Book a hotel room.

    Args:
        city: The city of the hotel.
        check_in: The arrival date as YYYY-MM-DD.
        nights: How many nights to stay.
        guests: How many guests share the room.
        room_type: The kind of room.

    Returns:
        A confirmation code, the check-out date and the total price in USD.
    """
    name = _city(city)
    start = _date(check_in, "check_in")
    n = _count(nights, "nights", 1, 60)
    g = _count(guests, "guests", 1, 6)
    base = {"single": 90, "double": 130, "suite": 260}[_choice(room_type, "room_type", ("single", "double", "suite"))]
    nightly = base * (0.8 + 0.6 * _unit("hotel", name)) + 15 * (g - 1)
    code = hashlib.blake2b(f"{name}|{check_in}|{n}|{g}|{room_type}".encode(), digest_size=4).hexdigest().upper()
    return {"confirmation": f"HT-{code}", "city": name, "check_out": (start + dt.timedelta(days=n)).isoformat(),
            "room_type": room_type, "guests": g, "total_price_usd": _r(nightly * n)}  # fmt: skip


def get_distance(origin: str, destination: str, unit: Literal["km", "miles"] = "km") -> dict:
    """Get the great-circle distance between two cities.

    Args:
        origin: The first city.
        destination: The second city.
        unit: The unit of the distance.

    Returns:
        The distance rounded to 1 decimal, in the requested unit.
    """
    km = _haversine_km(_city(origin, "origin"), _city(destination, "destination"))
    _choice(unit, "unit", ("km", "miles"))
    return {"distance": _r(km if unit == "km" else km / 1.609344, 1), "unit": unit}


def rent_car(city: str, pickup_date: str, days: int,
             car_class: Literal["economy", "compact", "suv", "luxury"] = "economy") -> dict:  # fmt: skip
    """Reserve a rental car.

    Args:
        city: The city to pick the car up in.
        pickup_date: The pick-up date as YYYY-MM-DD.
        days: For how many days to rent the car.
        car_class: The class of car.

    Returns:
        A reservation code, the return date and the total price in USD.
    """
    name = _city(city)
    start = _date(pickup_date, "pickup_date")
    n = _count(days, "days", 1, 90)
    daily = {"economy": 35, "compact": 45, "suv": 75, "luxury": 140}[
        _choice(car_class, "car_class", ("economy", "compact", "suv", "luxury"))] * (0.85 + 0.4 * _unit("car", name))
    code = hashlib.blake2b(f"{name}|{pickup_date}|{n}|{car_class}".encode(), digest_size=4).hexdigest().upper()
    return {"reservation": f"CR-{code}", "return_date": (start + dt.timedelta(days=n)).isoformat(),
            "total_price_usd": _r(daily * n)}  # fmt: skip


def convert_time(time: str, from_city: str, to_city: str) -> dict:
    """Convert a local clock time in one city to the local time in another city (standard time).

    Args:
        time: The local time in from_city, as 24-hour HH:MM.
        from_city: The city whose local time is given.
        to_city: The city whose local time is wanted.

    Returns:
        The local time in to_city as HH:MM and the day offset (-1, 0 or 1).
    """
    minutes = _time(time)
    shift = round((CITIES[_city(to_city, "to_city")][3] - CITIES[_city(from_city, "from_city")][3]) * 60)
    total = minutes + shift
    return {"time": _hhmm(total % (24 * 60)), "day_offset": total // (24 * 60)}


def plan_route(stops: list[str], mode: Literal["driving", "walking", "cycling", "transit"] = "driving") -> dict:
    """Plan a route through cities in the given order.

    Args:
        stops: The cities to visit in order, at least two.
        mode: How to travel.

    Returns:
        The legs with their distances in km, the total distance and the travel time in hours.
    """
    if not isinstance(stops, list) or not 2 <= len(stops) <= 10:
        raise ValueError("stops must be a list of 2 to 10 cities")
    names = [_city(s, "stop") for s in stops]
    speed = {"driving": 80, "walking": 5, "cycling": 18, "transit": 60}[
        _choice(mode, "mode", ("driving", "walking", "cycling", "transit"))]
    legs = [{"from": a, "to": b, "km": _r(1.25 * _haversine_km(a, b), 1)} for a, b in zip(names, names[1:])]
    total = sum(leg["km"] for leg in legs)
    return {"legs": legs, "total_km": _r(total, 1), "hours": _r(total / speed, 1)}


# ---------------------------------------------------------------------------- calendar


def create_event(title: str, date: str, start_time: str, duration_minutes: int = 60,
                 attendees: list[str] | None = None) -> dict:  # fmt: skip
    """Create a calendar event.

    Args:
        title: The event's title.
        date: The date as YYYY-MM-DD.
        start_time: The start time as 24-hour HH:MM.
        duration_minutes: How long the event lasts, in minutes.
        attendees: Email addresses of the people to invite.

    Returns:
        The event id, its start and end times and the invited attendees.
    """
    _text(title, "title")
    _date(date)
    start = _time(start_time, "start_time")
    length = _count(duration_minutes, "duration_minutes", 5, 24 * 60)
    people = list(attendees or [])
    if len(people) > MAX_ITEMS or not all(isinstance(p, str) and "@" in p for p in people):
        raise ValueError("attendees must be a list of email addresses")
    event_id = hashlib.blake2b(f"{_key(title)}|{date}|{start}|{length}".encode(), digest_size=4).hexdigest()
    return {"event_id": f"evt_{event_id}", "title": title, "date": date, "start": _hhmm(start),
            "end": _hhmm(start + length), "attendees": people}  # fmt: skip


def days_between(start_date: str, end_date: str) -> int:
    """Count the days from one date to another.

    Args:
        start_date: The first date as YYYY-MM-DD.
        end_date: The second date as YYYY-MM-DD.

    Returns:
        The number of days (negative when end_date is before start_date).
    """
    return (_date(end_date, "end_date") - _date(start_date, "start_date")).days


def add_days(date: str, days: int) -> str:
    """Add a number of days to a date.

    Args:
        date: The date as YYYY-MM-DD.
        days: The number of days to add (negative to go back).

    Returns:
        The resulting date as YYYY-MM-DD.
    """
    return (_date(date) + dt.timedelta(days=_count(days, "days", -36500, 36500))).isoformat()


def day_of_week(date: str) -> str:
    """Tell which day of the week a date falls on.

    Args:
        date: The date as YYYY-MM-DD.

    Returns:
        The weekday's English name, e.g. "Monday".
    """
    return _date(date).strftime("%A")


def count_business_days(start_date: str, end_date: str) -> int:
    """Count the weekdays (Monday to Friday) from one date up to and including another.

    Args:
        start_date: The first date as YYYY-MM-DD.
        end_date: The last date as YYYY-MM-DD, not before start_date.

    Returns:
        The number of weekdays in the range, both ends included.
    """
    start, end = _date(start_date, "start_date"), _date(end_date, "end_date")
    if not 0 <= (end - start).days <= 36500:
        raise ValueError("end_date must be on or after start_date, at most 100 years later")
    weeks, extra = divmod((end - start).days + 1, 7)
    return weeks * 5 + sum((start.weekday() + i) % 7 < 5 for i in range(extra))


def set_reminder(message: str, date: str, time: str,
                 repeat: Literal["none", "daily", "weekly", "monthly"] = "none") -> dict:  # fmt: skip
    """Set a reminder.

    Args:
        message: What to be reminded of.
        date: The date of the (first) reminder as YYYY-MM-DD.
        time: The time of the reminder as 24-hour HH:MM.
        repeat: How often the reminder repeats.

    Returns:
        The reminder id, when it fires first and how it repeats.
    """
    _text(message, "message")
    _date(date)
    _time(time)
    _choice(repeat, "repeat", ("none", "daily", "weekly", "monthly"))
    rid = hashlib.blake2b(f"{_key(message)}|{date}|{time}|{repeat}".encode(), digest_size=4).hexdigest()
    return {"reminder_id": f"rem_{rid}", "first": f"{date} {time}", "repeat": repeat}


# ---------------------------------------------------------------------------- units


def _convert(value: float, from_unit: str, to_unit: str, table: dict[str, float]) -> dict:
    v = _number(value, "value", low=-1e12, high=1e12)
    _choice(from_unit, "from_unit", table)
    _choice(to_unit, "to_unit", table)
    result = v * table[from_unit] / table[to_unit]
    return {"value": float(f"{result:.6g}"), "unit": to_unit}


def convert_length(value: float, from_unit: LengthUnit, to_unit: LengthUnit) -> dict:
    """Convert a length between metric and imperial units.

    Args:
        value: The length in from_unit.
        from_unit: The unit of the value (mm, cm, m, km, in, ft, yd or mi).
        to_unit: The unit to convert to.

    Returns:
        The converted length (6 significant digits) and its unit.
    """
    return _convert(value, from_unit, to_unit, LENGTH_M)


def convert_weight(value: float, from_unit: WeightUnit, to_unit: WeightUnit) -> dict:
    """Convert a weight (mass) between metric and imperial units.

    Args:
        value: The weight in from_unit.
        from_unit: The unit of the value (mg, g, kg, t for metric tons, oz or lb).
        to_unit: The unit to convert to.

    Returns:
        The converted weight (6 significant digits) and its unit.
    """
    return _convert(value, from_unit, to_unit, WEIGHT_KG)


def convert_volume(value: float, from_unit: VolumeUnit, to_unit: VolumeUnit) -> dict:
    """Convert a volume between metric and US customary units.

    Args:
        value: The volume in from_unit.
        from_unit: The unit of the value (ml, l, fl_oz, cup, pint, quart or gallon, US measures).
        to_unit: The unit to convert to.

    Returns:
        The converted volume (6 significant digits) and its unit.
    """
    return _convert(value, from_unit, to_unit, VOLUME_L)


def convert_speed(value: float, from_unit: SpeedUnit, to_unit: SpeedUnit) -> dict:
    """Convert a speed between kilometers per hour, miles per hour, meters per second and knots.

    Args:
        value: The speed in from_unit.
        from_unit: The unit of the value (kmh, mph, ms for meters per second, or knots).
        to_unit: The unit to convert to.

    Returns:
        The converted speed (6 significant digits) and its unit.
    """
    return _convert(value, from_unit, to_unit, SPEED_MS)


def convert_temperature(value: float, from_scale: Scale, to_scale: Scale) -> dict:
    """Convert a temperature between Celsius, Fahrenheit and Kelvin.

    Args:
        value: The temperature on from_scale.
        from_scale: The scale of the value.
        to_scale: The scale to convert to.

    Returns:
        The converted temperature rounded to 2 decimals and its scale.
    """
    v = _number(value, "value", low=-1e6, high=1e6)
    scales = ("celsius", "fahrenheit", "kelvin")
    _choice(from_scale, "from_scale", scales)
    _choice(to_scale, "to_scale", scales)
    kelvin = {"celsius": v + 273.15, "fahrenheit": (v - 32) * 5 / 9 + 273.15, "kelvin": v}[from_scale]
    if kelvin < 0:
        raise ValueError(f"{value} {from_scale} is below absolute zero")
    out = {"celsius": kelvin - 273.15, "fahrenheit": (kelvin - 273.15) * 9 / 5 + 32, "kelvin": kelvin}[to_scale]
    return {"value": _r(out), "scale": to_scale}


# ---------------------------------------------------------------------------- geometry


def circle_area(radius: float) -> float:
    """Compute the area of a circle.

    Args:
        radius: The circle's radius.

    Returns:
        The area, rounded to 4 decimals.
    """
    return _r(math.pi * _number(radius, "radius", low=0, high=1e9) ** 2, 4)


def rectangle_properties(length: float, width: float) -> dict:
    """Compute the area, perimeter and diagonal of a rectangle.

    Args:
        length: The rectangle's length.
        width: The rectangle's width.

    Returns:
        The area, the perimeter and the diagonal, rounded to 4 decimals.
    """
    a, b = _number(length, "length", low=0, high=1e9), _number(width, "width", low=0, high=1e9)
    return {"area": _r(a * b, 4), "perimeter": _r(2 * (a + b), 4), "diagonal": _r(math.hypot(a, b), 4)}


def triangle_area(base: float, height: float) -> float:
    """Compute the area of a triangle from its base and height.

    Args:
        base: The length of the base.
        height: The height perpendicular to the base.

    Returns:
        The area, rounded to 4 decimals.
    """
    return _r(0.5 * _number(base, "base", low=0, high=1e9) * _number(height, "height", low=0, high=1e9), 4)


def point_distance(point_a: list[float], point_b: list[float]) -> float:
    """Compute the Euclidean distance between two points in 2D or 3D.

    Args:
        point_a: The coordinates of the first point, e.g. [1, 2] or [1, 2, 3].
        point_b: The coordinates of the second point, with as many coordinates as point_a.

    Returns:
        The distance, rounded to 4 decimals.
    """
    for label, point in (("point_a", point_a), ("point_b", point_b)):
        if not isinstance(point, list) or len(point) not in (2, 3):
            raise ValueError(f"{label} must be a list of 2 or 3 coordinates")
    if len(point_a) != len(point_b):
        raise ValueError("point_a and point_b must have the same number of coordinates")
    a = [_number(x, "point_a", low=-1e9, high=1e9) for x in point_a]
    b = [_number(x, "point_b", low=-1e9, high=1e9) for x in point_b]
    return _r(math.dist(a, b), 4)


def polygon_perimeter(side_lengths: list[float]) -> float:
    """Compute the perimeter of a polygon from its side lengths.

    Args:
        side_lengths: The length of every side, at least three.

    Returns:
        The perimeter, rounded to 4 decimals.
    """
    if not isinstance(side_lengths, list) or not 3 <= len(side_lengths) <= MAX_ITEMS:
        raise ValueError(f"side_lengths must be a list of 3 to {MAX_ITEMS} lengths")
    return _r(sum(_number(s, "side_lengths", low=0, high=1e9) for s in side_lengths), 4)


def cylinder_volume(radius: float, height: float) -> float:
    """Compute the volume of a cylinder.

    Args:
        radius: The radius of the base.
        height: The height of the cylinder.

    Returns:
        The volume, rounded to 4 decimals.
    """
    return _r(math.pi * _number(radius, "radius", low=0, high=1e6) ** 2 * _number(height, "height", low=0, high=1e6), 4)


# ---------------------------------------------------------------------------- text


def count_words(text: str) -> int:
    """Count the words in a text (runs of characters between spaces).

    Args:
        text: The text.

    Returns:
        The number of words.
    """
    return len(_text(text).split())


def change_case(text: str, case: Literal["upper", "lower", "title", "snake"]) -> str:
    """Rewrite a text in another letter case.

    Args:
        text: The text.
        case: The case to use: UPPER, lower, Title Case or snake_case.

    Returns:
        The rewritten text.
    """
    value = _text(text)
    _choice(case, "case", ("upper", "lower", "title", "snake"))
    if case == "snake":
        return "_".join("".join(c if c.isalnum() else " " for c in value).lower().split())
    return {"upper": value.upper(), "lower": value.lower(), "title": value.title()}[case]


def is_palindrome(text: str, ignore_spaces: bool = True) -> bool:
    """Check whether a text reads the same backwards, ignoring letter case.

    Args:
        text: The text to check.
        ignore_spaces: Whether spaces and punctuation are ignored.

    Returns:
        True if the text is a palindrome.
    """
    value = _text(text).casefold()
    if not isinstance(ignore_spaces, bool):
        raise ValueError(f"ignore_spaces must be true or false, got {ignore_spaces!r}")
    if ignore_spaces:
        value = "".join(c for c in value if c.isalnum())
    return value == value[::-1]


def count_character(text: str, character: str, case_sensitive: bool = False) -> int:
    """Count how often a character occurs in a text.

    Args:
        text: The text to search.
        character: The single character to count.
        case_sensitive: Whether upper and lower case count as different characters.

    Returns:
        The number of occurrences.
    """
    value = _text(text)
    if not isinstance(character, str) or len(character) != 1:
        raise ValueError(f"character must be a single character, got {character!r}")
    if not isinstance(case_sensitive, bool):
        raise ValueError(f"case_sensitive must be true or false, got {case_sensitive!r}")
    if case_sensitive:
        return value.count(character)
    return value.casefold().count(character.casefold())


def reverse_words(text: str) -> str:
    """Reverse the order of the words in a text.

    Args:
        text: The text.

    Returns:
        The words in reverse order, separated by single spaces.
    """
    return " ".join(reversed(_text(text).split()))


def truncate_text(text: str, max_length: int, suffix: str = "...") -> str:
    """Shorten a text to at most max_length characters, ending with a suffix when cut.

    Args:
        text: The text.
        max_length: The longest result allowed, suffix included.
        suffix: What to append when the text is cut.

    Returns:
        The text itself if short enough, else its start followed by the suffix.
    """
    value = _text(text)
    n = _count(max_length, "max_length", 1, MAX_TEXT)
    end = _text(suffix, "suffix")
    if len(value) <= n:
        return value
    if len(end) >= n:
        raise ValueError("max_length must be longer than the suffix")
    return value[: n - len(end)] + end


# ---------------------------------------------------------------------------- shopping

Category = Literal["electronics", "books", "clothing", "home", "sports"]


def search_products(query: str, category: Category | None = None, max_price: float | None = None,
                    sort_by: Literal["relevance", "price_asc", "price_desc", "rating"] = "relevance") -> dict:  # fmt: skip
    """Search the store's catalogue.

    Args:
        query: Words describing the product, e.g. "wireless headphones".
        category: Only products of this category.
        max_price: Only products at most this price in USD.
        sort_by: The order of the results.

    Returns:
        Up to 5 matching products with their id, name, category, price in USD and rating.
    """
    words = _text(query, "query")
    if not words.strip():
        raise ValueError("query must not be empty")
    cats = ("electronics", "books", "clothing", "home", "sports")
    if category is not None:
        _choice(category, "category", cats)
    limit = None if max_price is None else _number(max_price, "max_price", low=0, high=1e9)
    order = _choice(sort_by, "sort_by", ("relevance", "price_asc", "price_desc", "rating"))
    q = _key(words)
    items = []
    for i in range(8):
        cat = category or cats[int(5 * _unit("cat", q, i))]
        price = _r(5 + 295 * _unit("price", q, cat, i))
        if limit is not None and price > limit:
            continue
        items.append({"id": f"P{int(1e5 * _unit('pid', q, cat, i)):05d}", "name": f"{words.strip().title()} #{i + 1}",
                      "category": cat, "price": price, "rating": _r(3 + 2 * _unit("rating", q, cat, i), 1)})  # fmt: skip
    key = {"relevance": None, "price_asc": lambda p: (p["price"], p["id"]),
           "price_desc": lambda p: (-p["price"], p["id"]), "rating": lambda p: (-p["rating"], p["id"])}[order]  # fmt: skip
    return {"results": (sorted(items, key=key) if key else items)[:5]}


def cart_total(items: list[dict[str, float]], coupon_percent: float = 0.0) -> dict:
    """Compute the total of a shopping cart.

    Args:
        items: The cart lines, each {"price": unit price, "quantity": how many}.
        coupon_percent: A discount in percent applied to the subtotal.

    Returns:
        The subtotal, the discount and the total, with 2 decimals.
    """
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_ITEMS:
        raise ValueError(f"items must be a list of 1 to {MAX_ITEMS} cart lines")
    subtotal = 0.0
    for i, line in enumerate(items):
        if not isinstance(line, dict) or set(line) != {"price", "quantity"}:
            raise ValueError(f"items[{i}] must be an object with exactly the keys price and quantity")
        subtotal += _number(line["price"], f"items[{i}].price", low=0, high=1e9) * _number(
            line["quantity"], f"items[{i}].quantity", low=0, high=1e6)
    discount = subtotal * _number(coupon_percent, "coupon_percent", low=0, high=100) / 100
    return {"subtotal": _r(subtotal), "discount": _r(discount), "total": _r(subtotal - discount)}


def apply_discount(price: float, percent: float) -> float:
    """Apply a percentage discount to a price.

    Args:
        price: The original price.
        percent: The discount in percent, e.g. 20 for 20% off.

    Returns:
        The discounted price, with 2 decimals.
    """
    return _r(_number(price, "price", low=0, high=1e12) * (1 - _number(percent, "percent", low=0, high=100) / 100))


def estimate_shipping(weight_kg: float, destination_country: str,
                      speed: Literal["standard", "express", "overnight"] = "standard") -> dict:  # fmt: skip
    """Estimate the cost and delivery time of shipping a parcel.

    Args:
        weight_kg: The parcel's weight in kilograms.
        destination_country: The country the parcel goes to.
        speed: The shipping speed.

    Returns:
        The price in USD and the delivery time in business days.
    """
    w = _number(weight_kg, "weight_kg", low=0.01, high=1000)
    country = _text(destination_country, "destination_country").strip()
    if not country:
        raise ValueError("destination_country must not be empty")
    factor, days = SHIPPING_SPEED[_choice(speed, "speed", SHIPPING_SPEED)]
    zone = 1 + int(3 * _unit("zone", _key(country)))
    return {"price_usd": _r((4.5 + 2.1 * w) * zone * factor), "business_days": days + zone - 1}


def track_package(tracking_number: str, carrier: Literal["ups", "fedex", "dhl", "usps"]) -> dict:
    """Track a parcel.

    Args:
        tracking_number: The tracking number printed on the label.
        carrier: The shipping company.

    Returns:
        The parcel's status and the city it was last scanned in.
    """
    number = _text(tracking_number, "tracking_number").strip().upper()
    if not number.isalnum() or not 6 <= len(number) <= 30:
        raise ValueError(f"tracking_number must be 6-30 letters or digits, got {tracking_number!r}")
    _choice(carrier, "carrier", ("ups", "fedex", "dhl", "usps"))
    statuses = ("label created", "in transit", "out for delivery", "delivered")
    return {"tracking_number": number, "carrier": carrier,
            "status": statuses[int(len(statuses) * _unit("status", carrier, number))],
            "last_scan": list(CITIES)[int(len(CITIES) * _unit("scan", carrier, number))]}  # fmt: skip


# ---------------------------------------------------------------------------- health


def calculate_bmi(weight_kg: float, height_cm: float) -> dict:
    """Compute the body mass index.

    Args:
        weight_kg: The body weight in kilograms.
        height_cm: The height in centimeters.

    Returns:
        The BMI rounded to 1 decimal and its category (underweight, normal, overweight, obese).
    """
    w = _number(weight_kg, "weight_kg", low=1, high=700)
    h = _number(height_cm, "height_cm", low=30, high=300) / 100
    bmi = w / h**2
    category = "underweight" if bmi < 18.5 else "normal" if bmi < 25 else "overweight" if bmi < 30 else "obese"
    return {"bmi": _r(bmi, 1), "category": category}


def calories_burned(activity: Literal["running", "cycling", "swimming", "walking", "yoga"], minutes: int,
                    weight_kg: float = 70.0) -> int:  # fmt: skip
    """Estimate the calories burned by an activity.

    Args:
        activity: The activity.
        minutes: How long it lasted, in minutes.
        weight_kg: The person's weight in kilograms.

    Returns:
        The estimated kilocalories burned.
    """
    _choice(activity, "activity", MET)
    return round(MET[activity] * _number(weight_kg, "weight_kg", low=1, high=700) * _count(minutes, "minutes", 1, 1440) / 60)


def daily_water_intake(weight_kg: float, activity_level: Literal["low", "moderate", "high"] = "moderate") -> float:
    """Recommend a daily water intake.

    Args:
        weight_kg: The person's weight in kilograms.
        activity_level: How active the person is.

    Returns:
        The recommended liters of water per day, rounded to 1 decimal.
    """
    extra = {"low": 0.0, "moderate": 0.35, "high": 0.7}[_choice(activity_level, "activity_level", ("low", "moderate", "high"))]
    return _r(0.033 * _number(weight_kg, "weight_kg", low=1, high=700) + extra, 1)


# ---------------------------------------------------------------------------- math


def describe_numbers(numbers: list[float], measure: Literal["mean", "median", "stdev", "min", "max", "sum"] = "mean") -> float:
    """Compute one summary statistic of a list of numbers.

    Args:
        numbers: The numbers, at least two.
        measure: The statistic: mean, median, sample standard deviation (stdev), min, max or sum.

    Returns:
        The statistic, rounded to 4 decimals.
    """
    if not isinstance(numbers, list) or not 2 <= len(numbers) <= 10 * MAX_ITEMS:
        raise ValueError(f"numbers must be a list of 2 to {10 * MAX_ITEMS} numbers")
    values = [_number(x, "numbers", low=-1e12, high=1e12) for x in numbers]
    fn = {"mean": statistics.fmean, "median": statistics.median, "stdev": statistics.stdev, "min": min, "max": max,
          "sum": math.fsum}[_choice(measure, "measure", ("mean", "median", "stdev", "min", "max", "sum"))]  # fmt: skip
    return _r(float(fn(values)), 4)


def greatest_common_divisor(a: int, b: int) -> int:
    """Compute the greatest common divisor of two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The largest integer that divides both.
    """
    return math.gcd(_count(a, "a", -10**18, 10**18), _count(b, "b", -10**18, 10**18))


def is_prime(n: int) -> bool:
    """Check whether an integer is a prime number.

    Args:
        n: The integer to check, at most 10^12.

    Returns:
        True if n is prime.
    """
    value = _count(n, "n", -10**12, 10**12)
    if value < 2:
        return False
    return all(value % d for d in range(2, math.isqrt(value) + 1))


def factorial(n: int) -> int:
    """Compute n factorial (n!).

    Args:
        n: A non-negative integer, at most 30.

    Returns:
        The product 1 * 2 * ... * n.
    """
    return math.factorial(_count(n, "n", 0, 30))


# ---------------------------------------------------------------------------- cooking


def scale_recipe(ingredients: dict[str, float], servings: int, new_servings: int) -> dict:
    """Scale a recipe's ingredient quantities to another number of servings.

    Args:
        ingredients: The quantity of each ingredient for the original recipe, e.g. {"flour_g": 250, "eggs": 2}.
        servings: How many servings the original recipe makes.
        new_servings: How many servings to make.

    Returns:
        Each ingredient's scaled quantity, rounded to 2 decimals.
    """
    if not isinstance(ingredients, dict) or not 1 <= len(ingredients) <= MAX_ITEMS:
        raise ValueError(f"ingredients must map 1 to {MAX_ITEMS} ingredient names to quantities")
    factor = _count(new_servings, "new_servings", 1, 1000) / _count(servings, "servings", 1, 1000)
    return {"ingredients": {k: _r(_number(v, f"ingredients[{k!r}]", low=0, high=1e6) * factor)
                            for k, v in ingredients.items()}, "servings": new_servings}  # fmt: skip


def cooking_time(dish: Literal["chicken", "beef", "pork", "salmon", "turkey"], weight_kg: float,
                 doneness: Literal["rare", "medium", "well_done"] = "medium") -> dict:  # fmt: skip
    """Estimate the oven roasting time of a piece of meat or fish at 180 degrees Celsius.

    Args:
        dish: What is roasted.
        weight_kg: Its weight in kilograms.
        doneness: How well done it should be (poultry and pork are always cooked through).

    Returns:
        The roasting time in minutes and the target core temperature in degrees Celsius.
    """
    per_kg = {"chicken": 45, "beef": 40, "pork": 55, "salmon": 25, "turkey": 40}[
        _choice(dish, "dish", ("chicken", "beef", "pork", "salmon", "turkey"))]
    level = _choice(doneness, "doneness", ("rare", "medium", "well_done"))
    w = _number(weight_kg, "weight_kg", low=0.1, high=15)
    if dish in ("chicken", "turkey", "pork"):
        level = "well_done"
    factor = {"rare": 0.8, "medium": 1.0, "well_done": 1.2}[level]
    core = {"rare": 52, "medium": 60, "well_done": 74 if dish in ("chicken", "turkey") else 70}[level]
    return {"minutes": round(20 + per_kg * w * factor), "core_temperature_c": core}


DOMAINS: dict[str, tuple[Any, ...]] = {
    "weather": (get_current_weather, get_weather_forecast, get_air_quality, get_sunrise_sunset),
    "finance": (convert_currency, compound_interest, loan_monthly_payment, get_stock_price, portfolio_value,
                split_bill, income_tax),
    "travel": (search_flights, book_hotel, get_distance, rent_car, convert_time, plan_route),
    "calendar": (create_event, days_between, add_days, day_of_week, count_business_days, set_reminder),
    "units": (convert_length, convert_weight, convert_volume, convert_speed, convert_temperature),
    "geometry": (circle_area, rectangle_properties, triangle_area, point_distance, polygon_perimeter, cylinder_volume),
    "text": (count_words, change_case, is_palindrome, count_character, reverse_words, truncate_text),
    "shopping": (search_products, cart_total, apply_discount, estimate_shipping, track_package),
    "health": (calculate_bmi, calories_burned, daily_water_intake),
    "math": (describe_numbers, greatest_common_divisor, is_prime, factorial),
    "cooking": (scale_recipe, cooking_time),
}  # fmt: skip
FUNCTIONS = [fn for fns in DOMAINS.values() for fn in fns]
DOMAIN_OF = {fn.__name__: domain for domain, fns in DOMAINS.items() for fn in fns}

TOOLBOX = register_toolbox(make_toolbox("fncall", FUNCTIONS))
