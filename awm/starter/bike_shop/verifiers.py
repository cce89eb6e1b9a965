"""Verifiers for the bike_shop tasks: `final` is the database after the episode, `initial` the snapshot."""

import re

_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def _numbers(answer):
    text = _DATE.sub(" ", answer or "")  # "2026-04-01" must not count as the number 4
    return [float(n.replace(",", "")) for n in _NUMBER.findall(text)]


def _has_number(answer, value, tol=0.005):
    return any(abs(n - float(value)) <= tol for n in _numbers(answer))


def _norm(text):
    return re.sub(r"[^a-z0-9]+", " ", (text or "").lower()).strip()


def _same(final, initial, sql, *params):
    return final.query(sql, *params) == initial.query(sql, *params)


def _same_existing(final, initial, table, columns):
    """The snapshot's rows of `table` still have the same `columns` (rows added later are ignored)."""
    top = initial.scalar(f"SELECT COALESCE(max(id), 0) FROM {table}")
    return _same(final, initial, f"SELECT id, {columns} FROM {table} WHERE id <= %s ORDER BY id", top)


def _stock(db, product_id):
    return db.scalar("SELECT stock_qty FROM products WHERE id = %s", product_id)


def _new_rows(final, initial, table, order="id"):
    top = initial.scalar(f"SELECT COALESCE(max(id), 0) FROM {table}")
    return final.query(f"SELECT * FROM {table} WHERE id > %s ORDER BY {order}", top)


def verify_register_new_customer(final, initial, answer):
    email = "jonas.weber@example.com"
    if initial.one("SELECT id FROM customers WHERE lower(email) = %s", email):
        return False, "customer already existed in the snapshot"
    new = _new_rows(final, initial, "customers")
    if len(new) != 1:
        return False, f"expected exactly one new customer, found {len(new)}"
    c = new[0]
    if c["email"].lower() != email:
        return False, f"new customer has email {c['email']!r}"
    if (c["first_name"].strip().lower(), c["last_name"].strip().lower()) != ("jonas", "weber"):
        return False, f"new customer is named {c['first_name']} {c['last_name']}"
    if re.sub(r"\D", "", c["phone"] or "") != "5550199":
        return False, f"phone is {c['phone']!r}, expected 555-0199"
    bikes = _new_rows(final, initial, "bikes")
    if len(bikes) != 1:
        return False, f"expected exactly one new bike, found {len(bikes)}"
    b = bikes[0]
    if b["serial_number"].upper() != "CD24TS2-88412":
        return False, f"bike serial is {b['serial_number']!r}"
    if b["customer_id"] != c["id"]:
        return False, "the bike is not registered to the new customer"
    if b["brand"].strip().lower() != "cannondale" or "topstone 2" not in b["model"].lower():
        return False, f"bike is {b['brand']} {b['model']}, expected Cannondale Topstone 2"
    if b["bike_type"] != "gravel" or b["model_year"] != 2024 or (b["color"] or "").lower() != "olive":
        return False, f"bike details wrong: {b['bike_type']}, {b['model_year']}, {b['color']}"
    return True, "customer Jonas Weber created with his Cannondale Topstone 2 registered"


def verify_check_in_tune_up(final, initial, answer):
    new = _new_rows(final, initial, "repair_orders")
    if len(new) != 1:
        return False, f"expected exactly one new repair order, found {len(new)}"
    ro = new[0]
    if ro["bike_id"] != 30:
        return False, f"repair order is for bike {ro['bike_id']}, expected bike 30 (serial WSBC1826112)"
    if ro["service_type_id"] != 2:
        return False, f"service type is {ro['service_type_id']}, expected 2 (basic tune-up)"
    if ro["due_date"] != "2026-04-17":
        return False, f"due date is {ro['due_date']}, expected 2026-04-17"
    if ro["mechanic_id"] != 4:
        return False, f"assigned mechanic is {ro['mechanic_id']}, expected 4 (Hannah Okafor)"
    if ro["status"] != "received":
        return False, f"status is {ro['status']}, expected received"
    if abs(float(ro["labor_price"]) - 69.0) > 0.001:
        return False, f"labor price is {ro['labor_price']}, expected the base price 69.00"
    if not _same_existing(final, initial, "repair_orders", "status, mechanic_id"):
        return False, "existing repair orders were changed"
    return True, "tune-up repair order for bike 30 created and assigned to Hannah Okafor"


def verify_ring_up_sale(final, initial, answer):
    new = _new_rows(final, initial, "sales")
    if len(new) != 1:
        return False, f"expected exactly one new sale, found {len(new)}"
    sale = new[0]
    if sale["customer_id"] != 20 or sale["payment_method"] != "card" or sale["status"] != "completed":
        return False, f"sale is {sale['status']}/{sale['payment_method']} for customer {sale['customer_id']}"
    if sale["staff_id"] != 2:
        return False, "sale is not recorded under Maya Lin"
    items = final.query(
        "SELECT p.sku, si.quantity, si.unit_price FROM sale_items si JOIN products p ON p.id = si.product_id "
        "WHERE si.sale_id = %s ORDER BY p.sku",
        sale["id"],
    )
    got = {i["sku"]: i["quantity"] for i in items}
    if got != {"TLS-LEVERS": 1, "TUB-700-25": 2}:
        return False, f"sale items are {got}"
    if abs(float(sale["total"]) - 21.97) > 0.001:
        return False, f"sale total is {sale['total']}, expected 21.97"
    if _stock(final, 11) != _stock(initial, 11) - 2 or _stock(final, 53) != _stock(initial, 53) - 1:
        return False, "stock of TUB-700-25 / TLS-LEVERS was not reduced by the sold quantities"
    pts = "SELECT loyalty_points FROM customers WHERE id = 20"
    if final.scalar(pts) != initial.scalar(pts) + 21:
        return False, f"loyalty points are {final.scalar(pts)}, expected {initial.scalar(pts) + 21}"
    return True, "completed card sale of 2x TUB-700-25 and 1x TLS-LEVERS for Ravi Jensen"


def verify_refund_latest_purchase(final, initial, answer):
    sale = final.one("SELECT * FROM sales WHERE id = 70")
    if sale["status"] != "refunded":
        return False, f"sale 70 (Layla's latest purchase) is {sale['status']}"
    if "wrong size" not in (sale["refund_reason"] or "").lower():
        return False, f"refund reason is {sale['refund_reason']!r}"
    others = "SELECT id, status FROM sales WHERE id <> 70 ORDER BY id"
    if not _same(final, initial, others):
        return False, "other sales changed status"
    if _stock(final, 58) != _stock(initial, 58) + 1:
        return False, "the returned rain jacket (CLT-RAIN-M) was not put back into stock"
    pts = "SELECT loyalty_points FROM customers WHERE id = 37"
    if final.scalar(pts) != initial.scalar(pts) - 119:
        return False, f"loyalty points are {final.scalar(pts)}, expected {initial.scalar(pts) - 119}"
    return True, "sale 70 refunded, stock restored and loyalty points removed"


def verify_restock_brightride(final, initial, answer):
    new = _new_rows(final, initial, "purchase_orders")
    if len(new) != 1:
        return False, f"expected exactly one new purchase order, found {len(new)}"
    po = new[0]
    if po["supplier_id"] != 4:
        return False, f"purchase order is to supplier {po['supplier_id']}, expected 4 (BrightRide Lighting)"
    if po["status"] != "ordered":
        return False, f"purchase order is {po['status']}, expected it submitted (ordered)"
    items = final.query(
        "SELECT i.product_id, i.quantity, i.unit_cost, p.cost FROM purchase_order_items i "
        "JOIN products p ON p.id = i.product_id WHERE i.purchase_order_id = %s ORDER BY i.product_id",
        po["id"],
    )
    got = {i["product_id"]: i["quantity"] for i in items}
    if got != {36: 20, 37: 20}:
        return False, f"lines are {got}, expected 20x LGT-FR-400 (36) and 20x LGT-RR-100 (37)"
    if any(abs(float(i["unit_cost"]) - float(i["cost"])) > 0.001 for i in items):
        return False, "unit costs differ from the products' current cost"
    if not _same_existing(final, initial, "purchase_orders", "status"):
        return False, "existing purchase orders were changed"
    return True, "BrightRide purchase order for the two low-stock lights submitted"


def verify_receive_trailtech_and_resume_repair(final, initial, answer):
    po = final.one("SELECT status FROM purchase_orders WHERE id = 7")
    if po["status"] != "received":
        return False, f"purchase order 7 is {po['status']}, expected received"
    if final.scalar("SELECT status FROM purchase_orders WHERE id = 8") != "draft":
        return False, "purchase order 8 was changed"
    expected = {17: 12 - 1, 25: 20, 19: 4}
    for pid, delta in expected.items():
        if _stock(final, pid) != _stock(initial, pid) + delta:
            return False, f"stock of product {pid} is {_stock(final, pid)}, expected {_stock(initial, pid) + delta}"
    new_parts = [p for p in _new_rows(final, initial, "repair_parts")]
    if [(p["repair_order_id"], p["product_id"], p["quantity"]) for p in new_parts] != [(30, 17, 1)]:
        return False, f"new repair parts are {new_parts}, expected one DRV-CH-10 on order 30"
    ro = final.one("SELECT status FROM repair_orders WHERE id = 30")
    if ro["status"] != "in_progress":
        return False, f"repair order 30 is {ro['status']}, expected in_progress"
    return True, "TrailTech order received, chain fitted and repair 30 back in progress"


def verify_finish_flat_fix(final, initial, answer):
    ro = final.one("SELECT status, completed_at FROM repair_orders WHERE id = 36")
    if ro["status"] != "completed" or not ro["completed_at"]:
        return False, f"repair order 36 is {ro['status']}, expected completed"
    parts = final.query("SELECT product_id, quantity FROM repair_parts WHERE repair_order_id = 36")
    if parts != [{"product_id": 12, "quantity": 1}]:
        return False, f"parts on order 36 are {parts}, expected one TUB-700-35"
    if _stock(final, 12) != _stock(initial, 12) - 1:
        return False, "stock of TUB-700-35 was not reduced by one"
    if not _same(final, initial, "SELECT id, status FROM repair_orders WHERE id <> 36 ORDER BY id"):
        return False, "other repair orders changed status"
    return True, "tube recorded and repair order 36 completed"


def verify_cover_for_sick_mechanic(final, initial, answer):
    rows = final.query("SELECT id, mechanic_id, status FROM repair_orders WHERE id IN (27, 28) ORDER BY id")
    for r in rows:
        if r["mechanic_id"] != 5:
            return False, f"repair order {r['id']} is assigned to {r['mechanic_id']}, expected 5 (Lukas Berg)"
        if r["status"] != "in_progress":
            return False, f"repair order {r['id']} status changed to {r['status']}"
    rest = "SELECT id, mechanic_id, status FROM repair_orders WHERE id NOT IN (27, 28) ORDER BY id"
    if not _same(final, initial, rest):
        return False, "other repair orders were changed (e.g. Diego's completed order 33 must stay his)"
    return True, "Diego's in-progress orders 27 and 28 moved to Lukas Berg"


def verify_cancel_declined_repair(final, initial, answer):
    ro = final.one("SELECT status, cancel_reason FROM repair_orders WHERE id = 26")
    if ro["status"] != "cancelled":
        return False, f"repair order 26 is {ro['status']}, expected cancelled"
    if "customer declined quote" not in (ro["cancel_reason"] or "").lower():
        return False, f"cancel reason is {ro['cancel_reason']!r}"
    if not _same(final, initial, "SELECT id, status FROM repair_orders WHERE id <> 26 ORDER BY id"):
        return False, "other repair orders changed status"
    return True, "Noah Xu's repair order 26 cancelled"


def verify_reprice_marathon_tire(final, initial, answer):
    price = final.scalar("SELECT price FROM products WHERE id = 10")
    if abs(float(price) - 64.99) > 0.001:
        return False, f"Schwalbe Marathon price is {price}, expected 64.99"
    if not _same(final, initial, "SELECT id, price FROM products WHERE id <> 10 ORDER BY id"):
        return False, "other product prices changed"
    return True, "Schwalbe Marathon repriced to 64.99"


def verify_pickup_bill(final, initial, answer):
    ro = final.one("SELECT status, picked_up_at FROM repair_orders WHERE id = 32")
    if ro["status"] != "picked_up" or not ro["picked_up_at"]:
        return False, f"repair order 32 is {ro['status']}, expected picked_up"
    if not _same(final, initial, "SELECT id, status FROM repair_orders WHERE id <> 32 ORDER BY id"):
        return False, "other repair orders changed status"
    bill = initial.scalar(
        "SELECT r.labor_price + COALESCE((SELECT SUM(quantity * unit_price) FROM repair_parts WHERE repair_order_id = r.id), 0) "
        "FROM repair_orders r WHERE r.id = 32"
    )
    if not _has_number(answer, bill):
        return False, f"answer does not state the bill of {float(bill):.2f}"
    return True, f"order 32 picked up and bill {float(bill):.2f} reported"


def verify_customer_february_spend(final, initial, answer):
    total = initial.scalar(
        "SELECT SUM(total) FROM sales WHERE customer_id = 19 AND status = 'completed' "
        "AND created_at::date BETWEEN '2026-02-01' AND '2026-02-28'"
    )
    if not _has_number(answer, total):
        return False, f"answer does not contain {float(total):.2f}"
    return True, f"answer contains {float(total):.2f}"


def verify_rotor_units_march(final, initial, answer):
    units = initial.scalar(
        "SELECT SUM(si.quantity) FROM sale_items si JOIN sales s ON s.id = si.sale_id "
        "WHERE si.product_id = 28 AND s.status = 'completed' AND s.created_at::date BETWEEN '2026-03-01' AND '2026-03-31'"
    )
    if not _has_number(answer, units):
        return False, f"answer does not contain {units}"
    return True, f"answer contains {units} units"


def verify_low_stock_count(final, initial, answer):
    count = initial.scalar("SELECT count(*) FROM products WHERE active AND stock_qty <= reorder_level")
    if not _has_number(answer, count):
        return False, f"answer does not contain {count}"
    return True, f"answer contains {count}"


def verify_busiest_mechanic(final, initial, answer):
    rows = initial.query(
        "SELECT s.full_name, count(*) AS n FROM repair_orders r JOIN staff s ON s.id = r.mechanic_id "
        "WHERE r.status IN ('received', 'in_progress', 'waiting_parts') GROUP BY s.full_name ORDER BY n DESC, s.full_name"
    )
    top = rows[0]
    if len(rows) > 1 and rows[1]["n"] == top["n"]:
        return False, "data has a tie; task is ill-posed"
    text = _norm(answer)
    if _norm(top["full_name"]) not in text:
        return False, f"answer does not name {top['full_name']}"
    others = [r["full_name"] for r in rows[1:] if _norm(r["full_name"]) in text]
    if others:
        return False, f"answer also names {others}"
    if not _has_number(answer, top["n"]):
        return False, f"answer does not give the count {top['n']}"
    return True, f"answer names {top['full_name']} with {top['n']} open orders"


def verify_derailleur_supplier(final, initial, answer):
    row = initial.one(
        "SELECT s.name, s.lead_time_days FROM products p JOIN suppliers s ON s.id = p.supplier_id "
        "WHERE p.sku = 'DRV-RD-DEORE'"
    )
    text = _norm(answer).replace(" ", "")
    if _norm(row["name"]).replace(" ", "").replace("components", "") not in text:
        return False, f"answer does not name {row['name']}"
    if not _has_number(answer, row["lead_time_days"]):
        return False, f"answer does not give the lead time {row['lead_time_days']} days"
    return True, f"answer names {row['name']} and {row['lead_time_days']} days"
