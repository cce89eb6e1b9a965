"""Deterministic seed for the Spokes & Gears bicycle shop (store "today" is 2026-04-10)."""

import random
from datetime import date, datetime, timedelta

STAFF = [
    # id, full_name, role, email, active, hired_on
    (1, "Oliver Grant", "manager", "oliver.grant@spokesgears.shop", True, "2019-03-01"),
    (2, "Maya Lin", "sales", "maya.lin@spokesgears.shop", True, "2021-05-17"),
    (3, "Diego Ramos", "mechanic", "diego.ramos@spokesgears.shop", True, "2020-02-10"),
    (4, "Hannah Okafor", "mechanic", "hannah.okafor@spokesgears.shop", True, "2022-04-04"),
    (5, "Lukas Berg", "mechanic", "lukas.berg@spokesgears.shop", True, "2023-08-21"),
    (6, "Sam Whitfield", "mechanic", "sam.whitfield@spokesgears.shop", False, "2018-06-11"),
    (7, "Priya Shah", "sales", "priya.shah@spokesgears.shop", True, "2024-01-08"),
    (8, "Ethan Cole", "sales", "ethan.cole@spokesgears.shop", True, "2025-06-02"),
]

CATEGORIES = [
    (1, "Bikes", "Complete bicycles"),
    (2, "Tires & Tubes", "Tires, inner tubes and puncture repair"),
    (3, "Drivetrain", "Chains, cassettes, derailleurs, cables and pedals"),
    (4, "Brakes", "Brake pads, rotors, cables and bleed kits"),
    (5, "Helmets", "Road, urban and kids helmets"),
    (6, "Lights", "Front and rear lights"),
    (7, "Accessories", "Locks, pumps, bottles, racks and fenders"),
    (8, "Tools & Maintenance", "Tools, lubricants and cleaning"),
    (9, "Clothing", "Gloves, jerseys, jackets and socks"),
]

SUPPLIERS = [
    (1, "Velo Parts Distribution", "orders@veloparts.example", "555-0101", 5),
    (2, "Pedal Supply Co.", "sales@pedalsupply.example", "555-0102", 7),
    (3, "Summit Cycle Wholesale", "dealers@summitcycle.example", "555-0103", 14),
    (4, "BrightRide Lighting", "b2b@brightride.example", "555-0104", 6),
    (5, "TrailTech Components", "orders@trailtech.example", "555-0105", 10),
    (6, "Northwind Apparel", "wholesale@northwind-apparel.example", "555-0106", 12),
]

PRODUCTS = [
    # id, sku, name, category, supplier, price, cost, stock, reorder, active
    (1, "BK-HYB-M", "Riverside Hybrid 500 (M)", 1, 3, "649.00", "420.00", 3, 2, True),
    (2, "BK-HYB-L", "Riverside Hybrid 500 (L)", 1, 3, "649.00", "420.00", 2, 2, True),
    (3, "BK-ROAD-54", "Apex Road 2 (54cm)", 1, 3, "1199.00", "800.00", 1, 1, True),
    (4, "BK-MTB-M", "Ridgeback Trail 29 (M)", 1, 3, "899.00", "590.00", 2, 1, True),
    (5, "BK-KID-20", "Sprout Kids 20in", 1, 3, "279.00", "170.00", 4, 2, True),
    (6, "BK-CITY-E", "Metro E-City 500Wh", 1, 3, "2100.00", "1450.00", 1, 1, True),
    (7, "TIR-700-28-GP", "Continental Grand Prix 5000 700x28 tire", 2, 1, "72.99", "44.00", 14, 6, True),
    (8, "TIR-700-32-GK", "Panaracer GravelKing 700x32 tire", 2, 1, "54.99", "33.00", 5, 6, True),
    (9, "TIR-29-24-DHF", "Maxxis Minion DHF 29x2.4 tire", 2, 1, "79.99", "48.00", 6, 4, True),
    (10, "TIR-700-35-MAR", "Schwalbe Marathon 700x35 tire", 2, 1, "59.99", "36.00", 9, 4, True),
    (11, "TUB-700-25", "Inner tube 700x18-25 Presta", 2, 1, "7.99", "2.80", 48, 20, True),
    (12, "TUB-700-35", "Inner tube 700x28-35 Presta", 2, 1, "8.49", "3.00", 12, 20, True),
    (13, "TUB-29-SCH", "Inner tube 29x2.1-2.6 Schrader", 2, 1, "9.99", "3.60", 22, 12, True),
    (14, "TUB-20-SCH", "Inner tube 20x1.75 Schrader", 2, 1, "6.99", "2.40", 10, 6, True),
    (15, "TIR-PATCH", "Glueless patch kit", 2, 1, "4.99", "1.50", 35, 15, True),
    (16, "DRV-CH-11", "Shimano CN-HG601 11-speed chain", 3, 5, "39.99", "22.00", 11, 6, True),
    (17, "DRV-CH-10", "KMC X10 10-speed chain", 3, 5, "29.99", "15.50", 4, 6, True),
    (18, "DRV-CH-9", "KMC X9 9-speed chain", 3, 5, "21.99", "11.00", 9, 6, True),
    (19, "DRV-CS-11-32", "Shimano 105 11-speed cassette 11-32", 3, 5, "69.99", "41.00", 3, 3, True),
    (20, "DRV-CS-8", "Shimano HG41 8-speed cassette 11-34", 3, 5, "32.99", "18.00", 2, 3, False),
    (21, "DRV-CBL-SHIFT", "Shift cable and housing kit", 3, 5, "14.99", "5.50", 25, 10, True),
    (22, "DRV-RD-DEORE", "Shimano Deore rear derailleur", 3, 5, "84.99", "52.00", 2, 2, True),
    (23, "DRV-PED-FLAT", "Flat platform pedals", 3, 5, "34.99", "17.00", 8, 4, True),
    (24, "BRK-PAD-DISC-R", "Resin disc brake pads", 4, 5, "16.99", "7.00", 30, 12, True),
    (25, "BRK-PAD-DISC-M", "Metallic disc brake pads", 4, 5, "19.99", "8.50", 9, 12, True),
    (26, "BRK-PAD-RIM", "Rim brake pads (pair)", 4, 5, "9.99", "3.80", 18, 8, True),
    (27, "BRK-CBL", "Brake cable and housing kit", 4, 5, "12.99", "4.90", 20, 8, True),
    (28, "BRK-ROTOR-160", "Disc rotor 160mm 6-bolt", 4, 5, "29.99", "15.00", 6, 4, True),
    (29, "BRK-BLEED", "Mineral oil bleed kit", 4, 5, "24.99", "12.00", 5, 2, True),
    (30, "HLM-ROAD-M", "Aero road helmet (M)", 5, 2, "119.99", "62.00", 5, 3, True),
    (31, "HLM-ROAD-L", "Aero road helmet (L)", 5, 2, "119.99", "62.00", 4, 3, True),
    (32, "HLM-URB-M", "Urban commuter helmet (M)", 5, 2, "59.99", "29.00", 7, 4, True),
    (33, "HLM-URB-L", "Urban commuter helmet (L)", 5, 2, "59.99", "29.00", 2, 4, True),
    (34, "HLM-KID-S", "Kids helmet (S)", 5, 2, "39.99", "18.00", 9, 4, True),
    (35, "LGT-FR-800", "Front light 800 lumen USB-C", 6, 4, "49.99", "24.00", 12, 5, True),
    (36, "LGT-FR-400", "Front light 400 lumen", 6, 4, "29.99", "14.00", 4, 5, True),
    (37, "LGT-RR-100", "Rear light 100 lumen", 6, 4, "24.99", "11.00", 3, 5, True),
    (38, "LGT-SET", "Front and rear light set", 6, 4, "39.99", "19.00", 8, 4, True),
    (39, "ACC-LOCK-U", "U-lock with cable", 7, 2, "54.99", "27.00", 10, 4, True),
    (40, "ACC-LOCK-FOLD", "Folding lock", 7, 2, "79.99", "41.00", 3, 2, True),
    (41, "ACC-BOTTLE", "Water bottle 750ml", 7, 2, "9.99", "3.50", 40, 15, True),
    (42, "ACC-CAGE", "Alloy bottle cage", 7, 2, "12.99", "5.00", 22, 10, True),
    (43, "ACC-PUMP-FLOOR", "Floor pump with gauge", 7, 2, "44.99", "22.00", 6, 3, True),
    (44, "ACC-PUMP-MINI", "Mini pump", 7, 2, "24.99", "11.00", 15, 6, True),
    (45, "ACC-BELL", "Brass bell", 7, 2, "7.99", "2.50", 25, 10, True),
    (46, "ACC-FENDER-700", "Fender set 700c", 7, 2, "39.99", "18.00", 5, 3, True),
    (47, "ACC-RACK-REAR", "Rear pannier rack", 7, 2, "49.99", "24.00", 4, 2, True),
    (48, "ACC-KICKSTAND", "Adjustable kickstand", 7, 2, "19.99", "8.00", 6, 4, True),
    (49, "TLS-MULTI", "16-in-1 multitool", 8, 1, "29.99", "13.00", 14, 5, True),
    (50, "TLS-LUBE-WET", "Wet chain lube 120ml", 8, 1, "11.99", "4.50", 24, 10, True),
    (51, "TLS-LUBE-DRY", "Dry chain lube 120ml", 8, 1, "11.99", "4.50", 7, 10, True),
    (52, "TLS-DEGREASER", "Bike degreaser 500ml", 8, 1, "14.99", "6.00", 12, 6, True),
    (53, "TLS-LEVERS", "Tire levers (set of 3)", 8, 1, "5.99", "1.80", 30, 10, True),
    (54, "TLS-SEALANT", "Tubeless sealant 500ml", 8, 1, "24.99", "11.00", 8, 4, True),
    (55, "CLT-GLOVE-M", "Full-finger gloves (M)", 9, 6, "29.99", "13.00", 6, 4, True),
    (56, "CLT-GLOVE-L", "Full-finger gloves (L)", 9, 6, "29.99", "13.00", 3, 4, True),
    (57, "CLT-JERSEY-M", "Club jersey (M)", 9, 6, "69.99", "32.00", 5, 3, True),
    (58, "CLT-RAIN-M", "Rain jacket (M)", 9, 6, "119.99", "58.00", 3, 2, True),
    (59, "CLT-SOCKS", "Cycling socks", 9, 6, "12.99", "4.50", 20, 8, True),
    (60, "CLT-CAP", "Cycling cap", 9, 6, "19.99", "8.00", 10, 4, True),
]

FIRST_NAMES = [
    "Emma", "Liam", "Olivia", "Noah", "Ava", "Mateo", "Sofia", "Ethan", "Isabella", "Lucas",
    "Mia", "Aiden", "Amelia", "Kai", "Harper", "Leo", "Chloe", "Omar", "Zoe", "Ravi",
    "Nora", "Felix", "Grace", "Tomas", "Lily", "Jonah", "Aaliyah", "Marcus", "Elena", "Theo",
    "Freya", "Hugo", "Ines", "Caleb", "Yuki", "Owen", "Layla", "Samir", "Clara", "Dmitri",
]
LAST_NAMES = [
    "Anderson", "Brennan", "Castillo", "Dubois", "Eriksen", "Fischer", "Gallagher", "Hoffman",
    "Ibrahim", "Jensen", "Kowalski", "Larsen", "Moreau", "Nakamura", "O'Connell", "Patel",
    "Quinn", "Rossi", "Schneider", "Tanaka", "Ueda", "Vasquez", "Walsh", "Xu", "Yilmaz",
    "Zimmerman", "Becker", "Chen", "Delgado", "Evans", "Novak", "Haddad", "Lindqvist",
    "Mendes", "Petrov", "Sato", "Kim", "Reyes", "Okonkwo", "Murphy",
]

BIKE_MODELS = [
    # brand, model, type
    ("Trek", "FX 3", "hybrid"), ("Trek", "Domane AL 2", "road"), ("Trek", "Marlin 7", "mountain"),
    ("Specialized", "Sirrus X 3.0", "hybrid"), ("Specialized", "Allez", "road"),
    ("Specialized", "Rockhopper", "mountain"), ("Specialized", "Turbo Vado 4.0", "e-bike"),
    ("Giant", "Escape 2", "hybrid"), ("Giant", "Contend AR 3", "road"), ("Giant", "Talon 2", "mountain"),
    ("Cannondale", "Topstone 3", "gravel"), ("Cannondale", "Quick 4", "hybrid"),
    ("Canyon", "Grizl 6", "gravel"), ("Brompton", "C Line", "city"), ("Electra", "Townie 7D", "city"),
    ("Rad Power", "RadCity 5", "e-bike"), ("Cube", "Kathmandu Hybrid", "e-bike"),
    ("Woom", "Woom 4", "kids"), ("Scott", "Speedster 20", "road"), ("Surly", "Bridge Club", "gravel"),
]
COLORS = ["black", "white", "red", "blue", "green", "grey", "orange", "teal", "silver", "yellow"]
SERIAL_PREFIX = {
    "Trek": "WTU", "Specialized": "WSBC", "Giant": "GT", "Cannondale": "CD", "Canyon": "CY",
    "Brompton": "BR", "Electra": "EL", "Rad Power": "RAD", "Cube": "CB", "Woom": "WM",
    "Scott": "SC", "Surly": "SU",
}

SERVICE_TYPES = [
    (1, "FLAT", "Flat tire repair", "15.00", 20),
    (2, "TUNE-BASIC", "Basic tune-up", "69.00", 60),
    (3, "TUNE-FULL", "Full overhaul", "179.00", 180),
    (4, "BRAKE", "Brake service", "45.00", 45),
    (5, "DRIVETRAIN", "Drivetrain clean and replace", "59.00", 60),
    (6, "WHEEL-TRUE", "Wheel truing", "25.00", 30),
    (7, "EBIKE-DIAG", "E-bike diagnostic", "55.00", 45),
    (8, "FIT", "Bike fit session", "120.00", 90),
]
# parts typically used by a service (product ids)
SERVICE_PARTS = {1: [11, 12, 13, 14], 2: [21, 27, 50], 3: [16, 21, 27, 24], 4: [24, 25, 26, 27],
                 5: [16, 17, 18, 19], 6: [], 7: [], 8: []}


def _ts(d, hour, minute=0):
    return datetime(d.year, d.month, d.day, hour, minute).isoformat(sep=" ")


def rows():
    rng = random.Random(20260410)
    out = []

    out.append(("staff", [dict(id=i, full_name=n, role=r, email=e, active=a, hired_on=h)
                          for i, n, r, e, a, h in STAFF]))
    out.append(("categories", [dict(id=i, name=n, description=d) for i, n, d in CATEGORIES]))
    out.append(("suppliers", [dict(id=i, name=n, contact_email=e, phone=p, lead_time_days=lt)
                              for i, n, e, p, lt in SUPPLIERS]))
    products = {}
    prow = []
    for pid, sku, name, cat, sup, price, cost, stock, reorder, active in PRODUCTS:
        products[pid] = dict(id=pid, sku=sku, name=name, category_id=cat, supplier_id=sup,
                             price=price, cost=cost, stock_qty=stock, reorder_level=reorder,
                             active=active)
        prow.append(products[pid])

    # customers
    lasts = LAST_NAMES[:]
    rng.shuffle(lasts)
    customers = []
    start = date(2024, 1, 15)
    for i, (first, last) in enumerate(zip(FIRST_NAMES, lasts), start=1):
        handle = f"{first}.{last}".lower().replace("'", "")
        created = start + timedelta(days=rng.randint(0, 780))
        customers.append(dict(
            id=i, first_name=first, last_name=last, email=f"{handle}@example.com",
            phone=f"555-{rng.randint(2000, 9899):04d}", loyalty_points=0,
            created_at=_ts(created, rng.randint(9, 18), rng.choice([0, 15, 30, 45])),
        ))

    # bikes: every customer has one, some have two
    bikes = []
    bid = 0
    used_serials = set()
    for c in customers:
        for _ in range(1 if rng.random() < 0.65 else 2):
            bid += 1
            brand, model, btype = rng.choice(BIKE_MODELS)
            while True:
                serial = f"{SERIAL_PREFIX[brand]}{rng.randint(10, 25)}{rng.randint(10000, 99999)}"
                if serial not in used_serials:
                    used_serials.add(serial)
                    break
            bikes.append(dict(id=bid, customer_id=c["id"], brand=brand, model=model, bike_type=btype,
                              serial_number=serial, color=rng.choice(COLORS),
                              model_year=rng.randint(2015, 2025)))

    # sales history: 2026-01-05 .. 2026-04-09
    sales, items = [], []
    sellable = [p for p in prow if p["active"] and p["category_id"] != 1]
    bikes_for_sale = [p for p in prow if p["category_id"] == 1]
    sid = 0
    iid = 0
    day0 = date(2026, 1, 5)
    for _ in range(72):
        sid += 1
        d = day0 + timedelta(days=rng.randint(0, 94))
        created = datetime(d.year, d.month, d.day, rng.randint(10, 18), rng.choice([0, 10, 20, 30, 40, 50]))
        customer_id = rng.randint(1, 40) if rng.random() < 0.8 else None
        chosen = rng.sample(sellable, rng.choice([1, 1, 2, 2, 3]))
        if rng.random() < 0.06:
            chosen.append(rng.choice(bikes_for_sale))
        total = 0
        for p in chosen:
            iid += 1
            qty = rng.choice([1, 1, 1, 2]) if float(p["price"]) < 30 else 1
            items.append(dict(id=iid, sale_id=sid, product_id=p["id"], quantity=qty, unit_price=p["price"]))
            total += round(float(p["price"]) * 100) * qty
        r = rng.random()
        status = "completed" if r < 0.9 else ("refunded" if r < 0.96 else "voided")
        sale = dict(id=sid, customer_id=customer_id, staff_id=rng.choice([1, 2, 2, 7, 7, 8]),
                    status=status, payment_method=rng.choice(["card", "card", "card", "cash", "gift_card"]),
                    created_at=created.isoformat(sep=" "), completed_at=None, refunded_at=None,
                    refund_reason=None, total=f"{total / 100:.2f}")
        if status in ("completed", "refunded"):
            sale["completed_at"] = (created + timedelta(minutes=rng.randint(2, 9))).isoformat(sep=" ")
        if status == "refunded":
            sale["refunded_at"] = (created + timedelta(days=rng.randint(1, 10))).isoformat(sep=" ")
            sale["refund_reason"] = rng.choice(["Wrong size", "Changed mind", "Defective item"])
        if status == "voided":
            sale["total"] = "0.00"
        sales.append(sale)
    # keep sales in chronological id order
    sales.sort(key=lambda s: s["created_at"])
    remap = {s["id"]: new for new, s in enumerate(sales, start=1)}
    for s in sales:
        s["id"] = remap[s["id"]]
    for it in items:
        it["sale_id"] = remap[it["sale_id"]]
    items.sort(key=lambda it: (it["sale_id"], it["id"]))
    for n, it in enumerate(items, start=1):
        it["id"] = n

    # loyalty: one point per whole dollar of completed (not refunded) sales
    for s in sales:
        if s["status"] == "completed" and s["customer_id"]:
            customers[s["customer_id"] - 1]["loyalty_points"] += int(float(s["total"]))

    # repair history (closed orders) 2026-01-03 .. 2026-03-27
    repairs, parts = [], []
    rid = 0
    pid_ = 0
    service_weights = [1, 1, 1, 2, 2, 2, 2, 3, 4, 4, 5, 5, 6, 8]
    for _ in range(24):
        rid += 1
        d = date(2026, 1, 3) + timedelta(days=rng.randint(0, 83))
        bike = rng.choice(bikes)
        st = rng.choice(service_weights)
        if bike["bike_type"] != "e-bike" and st == 7:
            st = 2
        mech = rng.choice([3, 4, 5, 6]) if d < date(2026, 2, 15) else rng.choice([3, 4, 5])
        dropped = datetime(d.year, d.month, d.day, rng.randint(9, 17), rng.choice([0, 15, 30, 45]))
        status = "picked_up" if rng.random() < 0.9 else "cancelled"
        ro = dict(id=rid, bike_id=bike["id"], service_type_id=st, mechanic_id=mech, status=status,
                  labor_price=SERVICE_TYPES[st - 1][3], notes=None,
                  dropped_off_at=dropped.isoformat(sep=" "),
                  due_date=(d + timedelta(days=rng.randint(2, 5))).isoformat(),
                  completed_at=None, picked_up_at=None, cancel_reason=None)
        if status == "picked_up":
            done = dropped + timedelta(days=rng.randint(1, 3), hours=rng.randint(0, 4))
            ro["completed_at"] = done.isoformat(sep=" ")
            ro["picked_up_at"] = (done + timedelta(days=rng.randint(0, 3), hours=2)).isoformat(sep=" ")
            for prod in rng.sample(SERVICE_PARTS[st], min(len(SERVICE_PARTS[st]), rng.randint(0, 2))):
                pid_ += 1
                parts.append(dict(id=pid_, repair_order_id=rid, product_id=prod,
                                  quantity=1, unit_price=products[prod]["price"]))
        else:
            ro["cancel_reason"] = rng.choice(["Customer declined quote", "Customer sold the bike"])
        repairs.append(ro)
    repairs.sort(key=lambda r: r["dropped_off_at"])
    remap = {r["id"]: new for new, r in enumerate(repairs, start=1)}
    for r in repairs:
        r["id"] = remap[r["id"]]
    for p in parts:
        p["repair_order_id"] = remap[p["repair_order_id"]]
    parts.sort(key=lambda p: (p["repair_order_id"], p["id"]))
    for n, p in enumerate(parts, start=1):
        p["id"] = n

    # the current workshop board (ids 25..36), one per bike, bikes chosen deterministically
    ebikes = [b for b in bikes if b["bike_type"] == "e-bike"]
    others = [b for b in bikes if b["bike_type"] not in ("e-bike", "kids")]
    board_bikes = rng.sample(others, 11)
    ebike = rng.choice(ebikes)
    current = [
        # id, service, mechanic, status, dropped (day, hour), due, notes, parts[(product, qty)]
        (25, 2, None, "received", (8, 10), "2026-04-14", "Squeaky brakes, gears skipping", []),
        (26, 1, None, "received", (9, 16), "2026-04-11", "Rear flat", []),
        (27, 4, 3, "in_progress", (6, 11), "2026-04-10", "Front brake rubbing", [(24, 1)]),
        (28, 3, 3, "in_progress", (3, 9), "2026-04-13", "Annual overhaul", [(16, 1), (21, 1)]),
        (29, 5, 4, "in_progress", (7, 14), "2026-04-11", None, [(18, 1)]),
        (30, 5, 4, "waiting_parts", (2, 12), "2026-04-09", "Waiting for KMC X10 chain (customer upgrade)", []),
        (31, 4, 5, "waiting_parts", (4, 15), "2026-04-12", "Metallic pads on order", []),
        (32, 2, 5, "completed", (1, 10), "2026-04-06", None, [(27, 1), (50, 1)]),
        (33, 1, 3, "completed", (7, 9), "2026-04-08", None, [(11, 2)]),
        (34, 6, 5, "in_progress", (8, 13), "2026-04-12", "Rear wheel wobble", []),
        (36, 1, 4, "in_progress", (9, 11), "2026-04-10", "Front flat, thorn", []),
    ]
    for (rid, st, mech, status, (day, hour), due, notes, used), bike in zip(current, board_bikes):
        dropped = datetime(2026, 4, day, hour, 0)
        ro = dict(id=rid, bike_id=bike["id"], service_type_id=st, mechanic_id=mech, status=status,
                  labor_price=SERVICE_TYPES[st - 1][3], notes=notes,
                  dropped_off_at=dropped.isoformat(sep=" "), due_date=due,
                  completed_at=None, picked_up_at=None, cancel_reason=None)
        if status == "completed":
            ro["completed_at"] = (dropped + timedelta(days=1, hours=3)).isoformat(sep=" ")
        repairs.append(ro)
        for prod, qty in used:
            pid_ += 1
            parts.append(dict(id=len(parts) + 1, repair_order_id=rid, product_id=prod,
                              quantity=qty, unit_price=products[prod]["price"]))
    repairs.append(dict(id=35, bike_id=ebike["id"], service_type_id=7, mechanic_id=4, status="received",
                        labor_price="55.00", notes="Motor cuts out on hills",
                        dropped_off_at="2026-04-09 12:00:00", due_date="2026-04-15",
                        completed_at=None, picked_up_at=None, cancel_reason=None))
    repairs.sort(key=lambda r: r["id"])

    # purchase orders
    po_specs = [
        # id, supplier, status, created (m, d), items [(product, qty)]
        (1, 1, "received", (1, 8), [(11, 40), (13, 20), (50, 12)]),
        (2, 2, "received", (1, 20), [(39, 6), (41, 24), (32, 4)]),
        (3, 5, "received", (2, 3), [(16, 10), (24, 20), (27, 10), (21, 10)]),
        (4, 4, "received", (2, 17), [(35, 10), (38, 6)]),
        (5, 6, "cancelled", (2, 25), [(58, 4), (55, 6)]),
        (6, 1, "received", (3, 12), [(7, 10), (53, 20), (15, 20)]),
        (7, 5, "ordered", (4, 6), [(17, 12), (25, 20), (19, 4)]),
        (8, 2, "draft", (4, 9), [(33, 6)]),
    ]
    pos, po_items = [], []
    for po_id, sup, status, (m, d), lines in po_specs:
        created = datetime(2026, m, d, 9, 30)
        po = dict(id=po_id, supplier_id=sup, created_by=rng.choice([1, 2]), status=status, notes=None,
                  created_at=created.isoformat(sep=" "), ordered_at=None, received_at=None)
        if status in ("ordered", "received", "cancelled"):
            po["ordered_at"] = (created + timedelta(hours=2)).isoformat(sep=" ")
        if status == "received":
            lead = SUPPLIERS[sup - 1][4]
            po["received_at"] = (created + timedelta(days=lead, hours=5)).isoformat(sep=" ")
        if status == "cancelled":
            po["notes"] = "Supplier out of stock until May"
        pos.append(po)
        for prod, qty in lines:
            po_items.append(dict(id=len(po_items) + 1, purchase_order_id=po_id, product_id=prod,
                                 quantity=qty, unit_cost=products[prod]["cost"]))

    out.append(("products", prow))
    out.append(("customers", customers))
    out.append(("bikes", bikes))
    out.append(("sales", sales))
    out.append(("sale_items", items))
    out.append(("service_types", [dict(id=i, code=c, name=n, base_price=p, est_minutes=m)
                                  for i, c, n, p, m in SERVICE_TYPES]))
    out.append(("repair_orders", repairs))
    out.append(("repair_parts", parts))
    out.append(("purchase_orders", pos))
    out.append(("purchase_order_items", po_items))
    return out
