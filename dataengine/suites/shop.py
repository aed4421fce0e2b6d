"""Shop suite: a miniature of tau-bench retail with a small database per task.

Tool state (Task.initial_state), a JSON object:
    customers: {customer_id: {"name", "email", "address"}}
    products:  {product_id: {"name", "price", "stock"}}
    orders:    {order_id: {"customer_id", "status", "items": [{"product_id", "quantity",
                "unit_price"}], "address"}}; status is pending, processing, shipped, delivered
                or cancelled
    next_order_number: int, the number of the next order place_order creates ("#W<number>")

Tasks either ask a question (gold answer, read from the database) or ask for a change. Every
task has gold.end_state_hash = stable_hash of the state after replaying the gold calls on a copy
of initial_state (as tau-bench does), so a question task also fails if the agent changes the
database; change tasks have no gold answer (metadata["gold_reply"] is a confirmation text).
"Cancel unless shipped" tasks on a shipped order have the status as answer and an unchanged state. Tools raise ShopError with a message the
agent can act on (unknown id, order already shipped, not enough stock).

Level (metadata["level"]) = number of gold calls: 1, 2 or 3.
Problem key: database hash + question; the split is decided by the question text alone
(Draft.split_key), so the same question asked of two databases stays in one split.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from dataengine.suites.base import Draft, Suite, format_number, make_toolbox
from dataengine.suites.gold import replay
from dataengine.tools.registry import register_toolbox
from dataengine.types import Gold, ToolCall, stable_hash

OPEN_STATUSES = ("pending", "processing")
CLOSED_STATUSES = ("shipped", "delivered", "cancelled")


class ShopError(ValueError):
    """An invalid request to the shop (unknown id, forbidden change); the agent sees the message."""


def _customer(state: dict, customer_id: str) -> dict:
    if customer_id not in state["customers"]:
        raise ShopError(f"unknown customer id {customer_id!r}")
    return state["customers"][customer_id]


def _order(state: dict, order_id: str) -> dict:
    if order_id not in state["orders"]:
        raise ShopError(f"unknown order id {order_id!r} (order ids look like '#W1234567')")
    return state["orders"][order_id]


def _product(state: dict, product_id: str) -> dict:
    if product_id not in state["products"]:
        raise ShopError(f"unknown product id {product_id!r}")
    return state["products"][product_id]


def _order_view(order_id: str, order: dict) -> dict[str, Any]:
    total = round(sum(i["quantity"] * i["unit_price"] for i in order["items"]), 2)
    return {"order_id": order_id, **copy.deepcopy(order), "total": total}


def find_customer(state: dict, email: str) -> dict:
    """Find a customer by email address.

    Args:
        email: The customer's email address.

    Returns:
        The customer's id, name, email and default shipping address.
    """
    for customer_id, customer in state["customers"].items():
        if customer["email"].lower() == email.strip().lower():
            return {"customer_id": customer_id, **customer}
    raise ShopError(f"no customer with email {email!r}")


def list_customer_orders(state: dict, customer_id: str) -> list:
    """List the orders of a customer, oldest first.

    Args:
        customer_id: The customer's id.

    Returns:
        One {"order_id", "status"} object per order.
    """
    _customer(state, customer_id)
    orders = [(oid, o) for oid, o in state["orders"].items() if o["customer_id"] == customer_id]
    return [{"order_id": oid, "status": o["status"]} for oid, o in sorted(orders, key=lambda x: x[0])]


def get_order(state: dict, order_id: str) -> dict:
    """Get the details of an order.

    Args:
        order_id: The order id, like '#W1234567'.

    Returns:
        The order's customer, status, items (product, quantity, unit price), shipping address and total price.
    """
    return _order_view(order_id, _order(state, order_id))


def find_product(state: dict, name: str) -> dict:
    """Find a product by its name.

    Args:
        name: The product name (case does not matter).

    Returns:
        The product's id, name, unit price and units in stock.
    """
    for product_id, product in state["products"].items():
        if product["name"].lower() == name.strip().lower():
            return {"product_id": product_id, **product}
    raise ShopError(f"no product named {name!r}")


def get_product(state: dict, product_id: str) -> dict:
    """Get a product by its id.

    Args:
        product_id: The product id, like 'P12345'.

    Returns:
        The product's id, name, unit price and units in stock.
    """
    return {"product_id": product_id, **_product(state, product_id)}


def cancel_order(state: dict, order_id: str) -> dict:
    """Cancel an order that has not shipped yet; its items go back into stock.

    Args:
        order_id: The order id, like '#W1234567'.

    Returns:
        The cancelled order.
    """
    order = _order(state, order_id)
    if order["status"] not in OPEN_STATUSES:
        raise ShopError(f"order {order_id} cannot be cancelled: its status is {order['status']}")
    for item in order["items"]:
        _product(state, item["product_id"])["stock"] += item["quantity"]
    order["status"] = "cancelled"
    return _order_view(order_id, order)


def change_shipping_address(state: dict, order_id: str, address: str) -> dict:
    """Change the shipping address of an order that has not shipped yet.

    Args:
        order_id: The order id, like '#W1234567'.
        address: The new shipping address, written out in full.

    Returns:
        The updated order.
    """
    order = _order(state, order_id)
    if order["status"] not in OPEN_STATUSES:
        raise ShopError(f"the address of order {order_id} cannot change: its status is {order['status']}")
    if not address.strip():
        raise ShopError("the new address is empty")
    order["address"] = address.strip()
    return _order_view(order_id, order)


def restock(state: dict, product_id: str, quantity: int) -> dict:
    """Add received units of a product to its stock.

    Args:
        product_id: The product id, like 'P12345'.
        quantity: How many units arrived (a positive whole number).

    Returns:
        The product with its new stock.
    """
    product = _product(state, product_id)
    if isinstance(quantity, bool) or not isinstance(quantity, int) or quantity <= 0:
        raise ShopError(f"quantity must be a positive whole number, got {quantity!r}")
    product["stock"] += quantity
    return {"product_id": product_id, **product}


def place_order(state: dict, customer_id: str, product_id: str, quantity: int) -> dict:
    """Place a new order of one product for a customer, shipped to the customer's address.

    Args:
        customer_id: The customer's id.
        product_id: The product id, like 'P12345'.
        quantity: How many units to order (a positive whole number).

    Returns:
        The new order, with its order id.
    """
    customer = _customer(state, customer_id)
    product = _product(state, product_id)
    if isinstance(quantity, bool) or not isinstance(quantity, int) or quantity <= 0:
        raise ShopError(f"quantity must be a positive whole number, got {quantity!r}")
    if product["stock"] < quantity:
        raise ShopError(f"not enough stock of {product_id}: {product['stock']} left, {quantity} asked")
    product["stock"] -= quantity
    order_id = f"#W{state['next_order_number']}"
    state["next_order_number"] += 1
    state["orders"][order_id] = {
        "customer_id": customer_id,
        "status": "pending",
        "items": [{"product_id": product_id, "quantity": quantity, "unit_price": product["price"]}],
        "address": customer["address"],
    }
    return _order_view(order_id, state["orders"][order_id])


# Lookups: they return copies and never change the database.
READ_ONLY = ("find_customer", "list_customer_orders", "get_order", "find_product", "get_product")


def default_database(task: Any = None) -> dict[str, Any]:
    """The database for a shop task that brings none (hand-written tasks): a fixed random one."""
    return make_database(random.Random("shop-default-database"))


TOOLBOX = register_toolbox(
    make_toolbox(
        "shop",
        [find_customer, list_customer_orders, get_order, find_product, get_product, cancel_order,
         change_shipping_address, restock, place_order],
        make_initial_state=default_database,
        read_only=READ_ONLY,
    )
)

FIRST_NAMES = ["Ana", "Ben", "Chloe", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "James", "Kofi", "Lena",
               "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wei", "Yara"]  # fmt: skip
LAST_NAMES = ["Lopez", "Smith", "Kim", "Novak", "Okafor", "Rossi", "Tanaka", "Silva", "Meyer", "Haddad", "Brown",
              "Ivanova", "Nguyen", "Garcia", "Patel", "Jensen", "Moreau", "Costa", "Fischer", "Sato"]  # fmt: skip
STREETS = ["Elm St", "Oak Ave", "Maple Rd", "Pine Ln", "Cedar Blvd", "Birch Way", "Lake Dr", "Hill St", "River Rd",
           "Park Ave", "Mill Ln", "Rose Ct"]  # fmt: skip
CITIES = ["Springfield", "Riverton", "Fairview", "Lakewood", "Greenville", "Ashford", "Brookside", "Clayton",
          "Dunmore", "Easton"]  # fmt: skip
# (product name, price range in dollars)
CATALOG = [("Desk Lamp", (15, 60)), ("Office Chair", (80, 300)), ("Water Bottle", (8, 30)), ("Backpack", (30, 120)),
           ("Wireless Mouse", (12, 60)), ("Mechanical Keyboard", (50, 200)), ("Coffee Mug", (6, 20)),
           ("Yoga Mat", (15, 70)), ("Bluetooth Speaker", (25, 150)), ("Running Shoes", (50, 180)),
           ("Notebook", (3, 15)), ("Desk Organizer", (10, 40)), ("Phone Charger", (10, 45)), ("Sunglasses", (20, 150)),
           ("Wall Clock", (15, 80)), ("Throw Pillow", (10, 45)), ("Electric Kettle", (20, 90)),
           ("Headphones", (30, 300)), ("Plant Pot", (5, 35)), ("Tea Kettle", (20, 70))]  # fmt: skip


def _address(rng: random.Random) -> str:
    return f"{rng.randint(1, 999)} {rng.choice(STREETS)}, {rng.choice(CITIES)}"


def make_database(rng: random.Random) -> dict[str, Any]:
    """A random shop database: 3-5 customers, 5-8 products, 5-10 orders."""
    names = rng.sample([(f, s) for f in FIRST_NAMES for s in LAST_NAMES], rng.randint(3, 5))
    customers = {
        f"{f.lower()}_{s.lower()}_{rng.randint(1000, 9999)}": {
            "name": f"{f} {s}",
            "email": f"{f.lower()}.{s.lower()}{rng.randint(1, 99)}@example.com",
            "address": _address(rng),
        }
        for f, s in names
    }
    products = {}
    for name, (low, high) in rng.sample(CATALOG, rng.randint(5, 8)):
        products[f"P{rng.randint(10000, 99999)}"] = {
            "name": name,
            "price": round(rng.uniform(low, high), 2),
            "stock": rng.randint(0, 40),
        }
    orders: dict[str, Any] = {}
    number = rng.randint(1000000, 9000000)
    statuses = ["pending", "processing", "shipped", "delivered", "cancelled"]
    for _ in range(rng.randint(5, 10)):
        number += rng.randint(1, 5000)
        customer_id = rng.choice(list(customers))
        items = [
            {"product_id": pid, "quantity": rng.randint(1, 3), "unit_price": products[pid]["price"]}
            for pid in rng.sample(list(products), rng.randint(1, 3))
        ]
        orders[f"#W{number}"] = {
            "customer_id": customer_id,
            "status": rng.choices(statuses, weights=[3, 2, 2, 2, 1])[0],
            "items": items,
            "address": customers[customer_id]["address"],
        }
    return {"customers": customers, "products": products, "orders": orders, "next_order_number": number + 1}


def _call(tool: str, **arguments: Any) -> ToolCall:
    return ToolCall(name=tool, arguments=arguments)


def _latest_order(db: dict, customer_id: str) -> str | None:
    ids = [oid for oid, o in db["orders"].items() if o["customer_id"] == customer_id]
    return max(ids) if ids else None


def _question(rng: random.Random, db: dict, kind: str) -> tuple[str, list[ToolCall], str | None, str] | None:
    """(question, gold calls, gold answer or None, gold reply) for `kind`, or None if `db` has no fit."""
    orders, customers, products = db["orders"], db["customers"], db["products"]
    open_orders = [oid for oid, o in orders.items() if o["status"] in OPEN_STATUSES]
    if kind == "order_status":
        oid = rng.choice(list(orders))
        q = rng.choice([f"What is the status of order {oid}?", f"Can you check where my order {oid} is? I need its status."])
        return q, [_call("get_order", order_id=oid)], orders[oid]["status"], ""
    if kind == "order_total":
        oid = rng.choice(list(orders))
        total = _order_view(oid, orders[oid])["total"]
        q = f"How much did order {oid} cost in total, in dollars?"
        return q, [_call("get_order", order_id=oid)], format_number(total), ""
    if kind == "product_stock":
        pid = rng.choice(list(products))
        name = products[pid]["name"]
        if rng.random() < 0.7:  # by id: many distinct questions; by name: needs find_product
            q = rng.choice([f"How many units of product {pid} do we have in stock?",
                            f"What is the current stock of the {name} (product id {pid})?"])
            return q, [_call("get_product", product_id=pid)], str(products[pid]["stock"]), ""
        q = rng.choice([f"How many units of the {name} do we have in stock?", f"What is the current stock of {name}?"])
        return q, [_call("find_product", name=name)], str(products[pid]["stock"]), ""
    if kind == "order_count":
        cid = rng.choice(list(customers))
        n = sum(o["customer_id"] == cid for o in orders.values())
        q = f"Hi, my email is {customers[cid]['email']}. How many orders have I placed with you?"
        calls = [_call("find_customer", email=customers[cid]["email"]), _call("list_customer_orders", customer_id=cid)]
        return q, calls, str(n), ""
    if kind == "latest_status":
        with_orders = sorted({o["customer_id"] for o in orders.values()})
        cid = rng.choice(with_orders)
        oid = _latest_order(db, cid)
        q = f"I'm {customers[cid]['name']} ({customers[cid]['email']}). What is the status of my most recent order?"
        calls = [_call("find_customer", email=customers[cid]["email"]), _call("list_customer_orders", customer_id=cid)]
        return q, calls, orders[oid]["status"], ""
    if kind == "cancel":
        if not open_orders:
            return None
        oid = rng.choice(open_orders)
        q = rng.choice([f"Please cancel order {oid}.", f"I changed my mind about order {oid}; cancel it, please."])
        return q, [_call("cancel_order", order_id=oid)], None, f"Order {oid} has been cancelled."
    if kind == "cancel_latest":
        fits = sorted(cid for cid in customers if (oid := _latest_order(db, cid)) and orders[oid]["status"] in OPEN_STATUSES)
        if not fits:
            return None
        cid = rng.choice(fits)
        oid = _latest_order(db, cid)
        email = customers[cid]["email"]
        q = f"My email is {email}. Please cancel my most recent order."
        calls = [_call("find_customer", email=email), _call("list_customer_orders", customer_id=cid),
                 _call("cancel_order", order_id=oid)]  # fmt: skip
        return q, calls, None, f"Your order {oid} has been cancelled."
    if kind == "cancel_unless_shipped":
        oid = rng.choice(list(orders))
        status = orders[oid]["status"]
        q = f"Cancel order {oid} if it has not shipped yet; otherwise just tell me its status."
        if status in OPEN_STATUSES:
            calls = [_call("get_order", order_id=oid), _call("cancel_order", order_id=oid)]
            return q, calls, None, f"Order {oid} had not shipped, so I cancelled it."
        return q, [_call("get_order", order_id=oid)], status, ""
    if kind == "change_address":
        if not open_orders:
            return None
        oid = rng.choice(open_orders)
        address = _address(rng)
        if address == orders[oid]["address"]:
            return None
        q = f"Please ship order {oid} to {address} instead."
        return q, [_call("change_shipping_address", order_id=oid, address=address)], None, \
            f"Order {oid} will now ship to {address}."
    if kind == "restock":
        pid = rng.choice(list(products))
        name, n = products[pid]["name"], rng.randint(5, 60)
        q = f"We just received {n} more units of the {name}. Please update the stock."
        return q, [_call("find_product", name=name), _call("restock", product_id=pid, quantity=n)], None, \
            f"Added {n} units of {name} to stock."
    if kind == "place_order":
        cid = rng.choice(list(customers))
        in_stock = [pid for pid, p in products.items() if p["stock"] > 0]
        if not in_stock:
            return None
        pid = rng.choice(in_stock)
        n = rng.randint(1, min(3, products[pid]["stock"]))
        name, email = products[pid]["name"], customers[cid]["email"]
        q = f"Hello, I'm {customers[cid]['name']}, email {email}. I'd like to order {n} x {name}, shipped to my usual address."
        calls = [_call("find_customer", email=email), _call("find_product", name=name),
                 _call("place_order", customer_id=cid, product_id=pid, quantity=n)]  # fmt: skip
        return q, calls, None, f"Your order of {n} x {name} has been placed."
    raise ValueError(f"unknown shop task kind {kind!r}")


QUESTION_KINDS = ("order_status", "order_total", "product_stock", "order_count", "latest_status")
CHANGE_KINDS = ("cancel", "cancel_latest", "cancel_unless_shipped", "change_address", "restock", "place_order")
# Words a numeric answer may carry ("12.5 dollars", "$12.5" needs none; metadata["answer_units"]).
ANSWER_UNITS = {"order_total": ["dollars", "USD"], "product_stock": ["units"], "order_count": ["orders"]}


def draft(rng: random.Random) -> Draft:
    """One task on a fresh random database; the gold end state comes from replaying the calls."""
    while True:
        db = make_database(rng)
        kind = rng.choice(QUESTION_KINDS + CHANGE_KINDS)
        made = _question(rng, db, kind)
        if made is not None:
            break
    question, calls, answer, reply = made
    outputs, end_state = replay(TOOLBOX, calls, db)
    if kind == "place_order":
        reply += f" The order id is {outputs[-1]['order_id']}."
    changes = end_state != db
    metadata: dict[str, Any] = {
        "level": len(calls),
        "difficulty": len(calls),
        "n_steps": len(calls),
        "kind": kind,
        "changes_state": changes,
    }
    if reply:
        metadata["gold_reply"] = reply
    if kind in ANSWER_UNITS:
        metadata["answer_units"] = ANSWER_UNITS[kind]
    return Draft(
        question=question,
        key=f"{stable_hash(db)}:{question}",
        split_key=" ".join(question.split()),
        gold=Gold(
            answer=answer,
            calls=calls,
            needs_tool=True,
            end_state_hash=stable_hash(end_state),
        ),
        metadata=metadata,
        initial_state=db,
    )


SUITE = Suite(
    name="shop",
    description="Retail customer service on a per-task database (tau-bench style): questions and state changes judged by end state.",
    toolbox=TOOLBOX,
    draft=draft,
)
