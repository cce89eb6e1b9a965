"""Seed data for the B2B sales CRM (the seller is Corvane Software; the acting rep is user 1).

Deterministic: a fixed random.Random seed and fixed dates (everything happens between mid-2025
and 2026-03-15). The records the tasks talk about are written out by hand; the rest of the book
of business (other reps' accounts, deals, activities and tasks) is generated.
"""

import random
from datetime import date, datetime, timedelta

SEED = 20260316
STAGES = ["prospecting", "qualification", "proposal", "negotiation"]
PROBABILITY = {"prospecting": 10, "qualification": 20, "proposal": 50, "negotiation": 75,
               "closed_won": 100, "closed_lost": 0}
LAST_DAY = date(2026, 3, 15)  # the data ends here

TEAMS = [
    (1, "Enterprise West", "West", "enterprise"),
    (2, "Enterprise East", "East", "enterprise"),
    (3, "Mid-Market Central", "Central", "mid_market"),
    (4, "SMB Inside Sales", "National", "smb"),
]

# id, name, role, team, quarterly quota, active, hired on
USERS = [
    (1, "Jordan Reyes", "rep", 1, 450000, True, "2023-04-03"),
    (2, "Priya Shah", "manager", 1, 1200000, True, "2021-09-13"),
    (3, "Sam Okafor", "rep", 1, 420000, True, "2024-01-08"),
    (4, "Lena Fischer", "rep", 1, 400000, True, "2024-06-17"),
    (5, "Ethan Brooks", "rep", 1, 380000, False, "2022-02-14"),
    (6, "Marcus Bell", "manager", 2, 1100000, True, "2020-11-02"),
    (7, "Aiko Tanaka", "rep", 2, 430000, True, "2022-08-22"),
    (8, "Diego Alvarez", "rep", 2, 410000, True, "2023-10-30"),
    (9, "Hannah Cole", "rep", 2, 390000, True, "2025-03-03"),
    (10, "Ruth Adeyemi", "manager", 3, 800000, True, "2021-05-10"),
    (11, "Tom Lindqvist", "rep", 3, 260000, True, "2023-02-06"),
    (12, "Grace Liu", "rep", 3, 250000, True, "2024-09-09"),
    (13, "Omar Haddad", "manager", 4, 500000, True, "2022-01-17"),
    (14, "Bella Moreno", "rep", 4, 150000, True, "2025-01-13"),
    (15, "Caleb Wright", "rep", 4, 150000, True, "2024-04-22"),
    (16, "Kevin Price", "sales_ops", None, 0, True, "2020-06-01"),
]

# id, name, industry, type, employees, annual revenue, domain, city, state, area code, owner
ACCOUNTS = [
    (1, "Northwind Logistics", "Logistics", "customer", 1800, 420e6, "northwindlogistics.com", "Seattle", "WA", "206", 1),
    (2, "Brightlane Foods", "Food & Beverage", "customer", 950, 210e6, "brightlanefoods.com", "Portland", "OR", "503", 1),
    (3, "Kestrel Aerospace", "Manufacturing", "prospect", 4200, 1.3e9, "kestrelaero.com", "San Diego", "CA", "619", 1),
    (4, "Cedar Ridge Health", "Healthcare", "prospect", 2600, 540e6, "cedarridgehealth.org", "Boise", "ID", "208", 1),
    (5, "Summit Peak Outfitters", "Retail", "customer", 700, 150e6, "summitpeak.com", "Denver", "CO", "303", 1),
    (6, "Pacific Tidewater Bank", "Financial Services", "prospect", 3100, 880e6, "tidewaterbank.com", "San Francisco", "CA", "415", 1),
    (7, "Ironclad Construction", "Construction", "customer", 1200, 390e6, "ironcladbuild.com", "Phoenix", "AZ", "602", 1),
    (8, "Lumen Learning Co", "Education", "prospect", 450, 60e6, "lumenlearning.co", "Sacramento", "CA", "916", 1),
    (9, "Redwood Analytics", "Software", "customer", 380, 72e6, "redwoodanalytics.io", "San Jose", "CA", "408", 3),
    (10, "Copperline Energy", "Energy", "prospect", 2100, 960e6, "copperline-energy.com", "Salt Lake City", "UT", "801", 3),
    (11, "Bayshore Medical Partners", "Healthcare", "customer", 1500, 310e6, "bayshoremed.com", "Oakland", "CA", "510", 3),
    (12, "Granite Peak Insurance", "Financial Services", "prospect", 900, 240e6, "granitepeakins.com", "Reno", "NV", "775", 3),
    (13, "Silverleaf Hotels", "Hospitality", "customer", 2800, 470e6, "silverleafhotels.com", "Las Vegas", "NV", "702", 4),
    (14, "Orchard Valley Farms", "Food & Beverage", "prospect", 600, 95e6, "orchardvalley.com", "Fresno", "CA", "559", 4),
    (15, "Alder Creek Software", "Software", "partner", 220, 38e6, "aldercreek.dev", "Bend", "OR", "541", 4),
    (16, "Mesa Verde Utilities", "Energy", "prospect", 1300, 610e6, "mesaverdeutil.com", "Albuquerque", "NM", "505", 5),
    (17, "Hudson Freight Lines", "Logistics", "customer", 2400, 520e6, "hudsonfreight.com", "Newark", "NJ", "973", 7),
    (18, "Beacon Street Capital", "Financial Services", "prospect", 650, 300e6, "beaconstreetcap.com", "Boston", "MA", "617", 7),
    (19, "Lighthouse Pharma", "Healthcare", "customer", 5200, 2.1e9, "lighthousepharma.com", "Princeton", "NJ", "609", 7),
    (20, "Atlantic Crest Realty", "Real Estate", "prospect", 480, 85e6, "atlanticcrest.com", "Miami", "FL", "305", 8),
    (21, "Keystone Steelworks", "Manufacturing", "customer", 3300, 980e6, "keystonesteel.com", "Pittsburgh", "PA", "412", 8),
    (22, "Harbor & Pine Retail", "Retail", "churned", 1100, 190e6, "harborandpine.com", "Portland", "ME", "207", 8),
    (23, "Evergreen University", "Education", "prospect", 3900, 700e6, "evergreen.edu", "Burlington", "VT", "802", 9),
    (24, "Meridian Media Group", "Media", "customer", 820, 160e6, "meridianmedia.com", "New York", "NY", "212", 9),
    (25, "Prairie Wind Cooperative", "Agriculture", "customer", 340, 88e6, "prairiewind.coop", "Omaha", "NE", "402", 11),
    (26, "Lakeshore Dental Partners", "Healthcare", "prospect", 260, 41e6, "lakeshoredental.com", "Milwaukee", "WI", "414", 11),
    (27, "Riverbend Manufacturing", "Manufacturing", "customer", 780, 140e6, "riverbendmfg.com", "Dayton", "OH", "937", 11),
    (28, "Gateway Transit Solutions", "Logistics", "prospect", 510, 97e6, "gatewaytransit.com", "St. Louis", "MO", "314", 11),
    (29, "Blue Heron Brewing", "Food & Beverage", "customer", 190, 28e6, "blueheronbrew.com", "Madison", "WI", "608", 12),
    (30, "Quarry Hill Architects", "Professional Services", "prospect", 140, 22e6, "quarryhill.com", "Minneapolis", "MN", "612", 12),
    (31, "Tallgrass Veterinary", "Healthcare", "customer", 230, 35e6, "tallgrassvet.com", "Kansas City", "MO", "816", 12),
    (32, "Fern & Finch Boutique", "Retail", "customer", 35, 4.2e6, "fernandfinch.com", "Austin", "TX", "512", 14),
    (33, "Clearwater Plumbing Co", "Construction", "prospect", 60, 9e6, "clearwaterplumbing.com", "Tampa", "FL", "813", 14),
    (34, "Pinecone Daycare Centers", "Education", "customer", 90, 7.5e6, "pineconedaycare.com", "Raleigh", "NC", "919", 14),
    (35, "Sparrow Legal LLP", "Professional Services", "prospect", 45, 11e6, "sparrowlegal.com", "Charlotte", "NC", "704", 15),
    (36, "Oakmont Fitness Studios", "Hospitality", "customer", 120, 14e6, "oakmontfitness.com", "Nashville", "TN", "615", 15),
]

# id, sku, name, family, billing, unit price, active
PRODUCTS = [
    (1, "CRM-STD-SEAT", "Corvane Standard seat", "subscription", "annual", 540, True),
    (2, "CRM-PRO-SEAT", "Corvane Professional seat", "subscription", "annual", 960, True),
    (3, "CRM-ENT-SEAT", "Corvane Enterprise seat", "subscription", "annual", 1500, True),
    (4, "ANL-ADDON", "Advanced Analytics add-on (per seat)", "add_on", "annual", 240, True),
    (5, "MOB-ADDON", "Field Mobile app add-on (per seat)", "add_on", "annual", 180, True),
    (6, "CPQ-ADDON", "Quote-to-Cash module", "add_on", "annual", 4800, True),
    (7, "API-PLUS", "API Plus (org-wide)", "add_on", "annual", 6000, True),
    (8, "SSO-ADDON", "SSO & SCIM provisioning", "add_on", "annual", 3600, True),
    (9, "SBX-EXTRA", "Additional sandbox", "add_on", "annual", 2400, True),
    (10, "STO-100GB", "Extra storage 100 GB", "add_on", "annual", 1200, True),
    (11, "ONB-STD", "Standard onboarding package", "services", "one_time", 5000, True),
    (12, "ONB-PREM", "Premium onboarding package", "services", "one_time", 12000, True),
    (13, "MIG-DATA", "Data migration service", "services", "one_time", 8500, True),
    (14, "TRN-DAY", "On-site training day", "services", "one_time", 2200, True),
    (15, "INT-CUSTOM", "Custom integration package", "services", "one_time", 15000, True),
    (16, "SUP-PREM", "Premium support", "support", "annual", 9000, True),
    (17, "SUP-247", "24x7 mission-critical support", "support", "annual", 18000, True),
    (18, "CRM-CLASSIC-SEAT", "Corvane Classic seat (retired)", "subscription", "annual", 400, False),
]
PRICE = {p[0]: p[5] for p in PRODUCTS}

FIRST = ["Olivia", "Liam", "Emma", "Noah", "Ava", "Ethan", "Sophia", "Mason", "Isabella", "Lucas",
         "Mia", "Logan", "Amelia", "James", "Harper", "Benjamin", "Evelyn", "Henry", "Abigail",
         "Daniel", "Emily", "Matthew", "Ella", "Samuel", "Grace", "David", "Chloe", "Joseph",
         "Victoria", "Carter", "Riley", "Owen", "Nora", "Wyatt", "Zoe", "Julian", "Hazel", "Leo",
         "Aria", "Isaac", "Priyanka", "Wei", "Fatima", "Mateo", "Yuki", "Kwame", "Ines", "Rafael"]
LAST = ["Anderson", "Brooks", "Carver", "Dawson", "Ellis", "Foster", "Garcia", "Hughes", "Iverson",
        "Jensen", "Kim", "Lawson", "Morales", "Nguyen", "Ortiz", "Patel", "Quinn", "Ramirez",
        "Sullivan", "Thompson", "Underwood", "Vasquez", "Walker", "Xu", "Young", "Zimmerman",
        "Bennett", "Chavez", "Donovan", "Fletcher", "Gallagher", "Holloway", "Kowalski", "Lindgren",
        "Mendoza", "Novak", "O'Brien", "Park", "Rossi", "Schneider", "Tanaka", "Whitaker"]
TITLES = ["Chief Operating Officer", "VP of Sales", "Director of IT", "Head of Procurement",
          "Sales Operations Manager", "CFO", "IT Manager", "Director of Customer Success",
          "Operations Manager", "VP of Marketing", "Systems Administrator", "Controller"]
THEMES = ["Professional seats expansion", "Platform renewal", "New business", "Analytics add-on",
          "Field Mobile rollout", "Enterprise upgrade", "Onboarding services", "Support upgrade",
          "Integration project", "Regional rollout"]
LOSS_REASONS = ["Chose competitor", "No budget this year", "Building in-house", "Project postponed",
                "Pricing too high", "No decision"]


def _ts(d, hour=10, minute=0):
    return datetime(d.year, d.month, d.day, hour, minute).isoformat() + "+00:00"


def _d(s):
    return date.fromisoformat(s)


def rows():
    rng = random.Random(SEED)
    out = []

    # ---- teams, users -------------------------------------------------------------------
    out.append(("teams", [dict(id=i, name=n, region=r, segment=s) for i, n, r, s in TEAMS]))
    users = []
    for uid, name, role, team, quota, active, hired in USERS:
        first, last = name.lower().split(" ")
        users.append(dict(id=uid, full_name=name, email=f"{first}.{last}@corvane.com", role=role,
                          team_id=team, quarterly_quota=quota, is_active=active, hired_on=hired))
    out.append(("users", users))
    team_of = {u[0]: u[3] for u in USERS}
    segment_of_team = {t[0]: t[3] for t in TEAMS}

    # ---- accounts ----------------------------------------------------------------------
    accounts = []
    for (aid, name, industry, typ, emp, rev, domain, city, state, area, owner) in ACCOUNTS:
        created = date(2024, 1, 15) + timedelta(days=aid * 17 + rng.randint(0, 30))
        accounts.append(dict(id=aid, name=name, industry=industry, type=typ, employees=emp,
                             annual_revenue=round(rev, 2), website=f"https://www.{domain}",
                             phone=f"({area}) 555-{rng.randint(1000, 1999)}", city=city,
                             state=state, country="US", owner_id=owner, created_at=_ts(created, 9)))
    out.append(("accounts", accounts))
    account = {a[0]: a for a in ACCOUNTS}

    # ---- contacts ----------------------------------------------------------------------
    # Hand-written contacts first (the tasks refer to some of them), then generated ones.
    fixed_contacts = {
        1: [("Rachel", "Dunmore", "VP of Operations"), ("Victor", "Almeida", "Director of IT"),
            ("Karen", "Obi", "Head of Procurement")],
        2: [("Martin", "Greaves", "COO"), ("Sofia", "Lindqvist", "IT Manager")],
        3: [("Hiroshi", "Sato", "VP of Engineering"), ("Claire", "Beaumont", "Director of IT"),
            ("Nathan", "Price", "Procurement Lead")],
        4: [("Angela", "Moretti", "CIO"), ("Brian", "Kessler", "Director of Patient Services")],
        5: [("Tyler", "Hanson", "Director of Store Operations"), ("Megan", "Ortiz", "IT Manager")],
        6: [("Olivia", "Grant", "CFO"), ("Samuel", "Achebe", "Chief Information Security Officer"),
            ("Laura", "Chen", "VP of Retail Banking")],
        7: [("Frank", "Delgado", "VP of Field Operations"), ("Janet", "Morrow", "Controller")],
        8: [("Paula", "Winters", "Director of Admissions"), ("Kevin", "Asante", "IT Manager")],
    }
    reserved = {("elena", "marsh"), ("derek", "hale"), ("dana", "whitfield"), ("tom", "becker")}
    contacts = []
    contacts_by_account = {}
    used_emails = set()
    cid = 0
    for (aid, name, industry, typ, emp, rev, domain, city, state, area, owner) in ACCOUNTS:
        people = list(fixed_contacts.get(aid, []))
        if not people:
            for _ in range(rng.randint(2, 3)):
                while True:
                    f, l = rng.choice(FIRST), rng.choice(LAST)
                    if (f.lower(), l.lower()) not in reserved and all(
                            (f, l) != (p[0], p[1]) for p in people):
                        break
                people.append((f, l, rng.choice(TITLES)))
        for i, (f, l, title) in enumerate(people):
            cid += 1
            email = f"{f.lower()}.{l.lower().replace(chr(39), '')}@{domain}"
            assert email not in used_emails
            used_emails.add(email)
            created = _d(accounts[aid - 1]["created_at"][:10]) + timedelta(days=rng.randint(0, 60))
            contacts.append(dict(id=cid, account_id=aid, first_name=f, last_name=l, title=title,
                                 email=email, phone=f"({area}) 555-{rng.randint(2000, 2999)}",
                                 is_primary=(i == 0), created_at=_ts(created, 11)))
            contacts_by_account.setdefault(aid, []).append(cid)
    out.append(("contacts", contacts))

    out.append(("products", [dict(id=i, sku=s, name=n, family=f, billing=b, unit_price=p,
                                  is_active=a) for i, s, n, f, b, p, a in PRODUCTS]))

    # ---- opportunities -----------------------------------------------------------------
    # id, account, name, stage, amount, expected close / closed on, created, loss reason
    fixed_opps = [
        (1, 1, "Northwind Logistics - Professional seats expansion", "negotiation", 100170, "2026-04-30", "2025-12-02", None),
        (2, 1, "Northwind Logistics - Advanced Analytics add-on", "proposal", 28800, "2026-05-15", "2026-01-14", None),
        (3, 2, "Brightlane Foods - 2026 renewal", "closed_won", 54000, "2026-02-27", "2025-11-18", None),
        (4, 3, "Kestrel Aerospace - Enterprise rollout", "proposal", 180000, "2026-06-30", "2026-01-09", None),
        (5, 3, "Kestrel Aerospace - Engineering pilot", "closed_won", 24000, "2026-01-20", "2025-10-21", None),
        (6, 4, "Cedar Ridge Health - Patient outreach platform", "qualification", 65000, "2026-07-31", "2026-02-03", None),
        (7, 5, "Summit Peak Outfitters - Field Mobile rollout", "prospecting", 12600, "2026-08-31", "2026-03-02", None),
        (8, 6, "Pacific Tidewater Bank - Enterprise platform", "negotiation", 132000, "2026-04-15", "2025-12-10", None),
        (9, 7, "Ironclad Construction - Field team seats", "proposal", 47700, "2026-05-29", "2026-01-27", None),
        (10, 8, "Lumen Learning Co - Campus pilot", "qualification", 18000, "2026-06-15", "2026-02-18", None),
        (11, 7, "Ironclad Construction - Support upgrade", "closed_lost", 18000, "2026-03-06", "2025-12-15", "Budget frozen until 2027"),
        (12, 5, "Summit Peak Outfitters - Premium onboarding", "closed_won", 16400, "2026-03-12", "2026-01-05", None),
        (13, 1, "Northwind Logistics - Initial Standard seats", "closed_won", 64800, "2025-09-30", "2025-07-08", None),
        (14, 10, "Copperline Energy - Grid operations rollout", "closed_won", 126000, "2026-02-13", "2025-10-06", None),
    ]
    opps = []
    for oid, aid, name, stage, amount, close, created, reason in fixed_opps:
        opps.append(dict(id=oid, account_id=aid, name=name, owner_id=account[aid][10], stage=stage,
                         amount=amount, probability=PROBABILITY[stage], expected_close_date=close,
                         primary_contact_id=contacts_by_account[aid][0],
                         lead_source="existing_customer" if account[aid][3] == "customer" else "outbound",
                         loss_reason=reason,
                         closed_on=close if stage.startswith("closed") else None,
                         created_at=_ts(_d(created), 15), updated_at=None))
    opps[9]["lead_source"] = "webinar"  # Lumen came in through a converted lead
    stage_weights = [("prospecting", 15), ("qualification", 20), ("proposal", 20),
                     ("negotiation", 12), ("closed_won", 20), ("closed_lost", 13)]
    oid = len(opps)
    for (aid, name, industry, typ, emp, rev, domain, city, state, area, owner) in ACCOUNTS[8:]:
        themes = rng.sample(THEMES, rng.randint(1, 2))
        for theme in themes:
            oid += 1
            stage = rng.choices([s for s, _ in stage_weights], [w for _, w in stage_weights])[0]
            seg = segment_of_team[team_of[owner]]
            lo, hi = {"enterprise": (200, 1800), "mid_market": (80, 700), "smb": (20, 200)}[seg]
            amount = rng.randint(lo, hi) * 100
            if stage.startswith("closed"):
                close = date(2025, 10, 1) + timedelta(days=rng.randint(0, 163))
            else:
                close = date(2026, 3, 31) + timedelta(days=rng.randint(0, 183))
            created = min(close, LAST_DAY) - timedelta(days=rng.randint(40, 150))
            opps.append(dict(id=oid, account_id=aid, name=f"{name} - {theme}", owner_id=owner,
                             stage=stage, amount=amount, probability=PROBABILITY[stage],
                             expected_close_date=close.isoformat(),
                             primary_contact_id=rng.choice(contacts_by_account[aid]),
                             lead_source=rng.choice(["outbound", "inbound", "partner",
                                                     "existing_customer", "event"]),
                             loss_reason=rng.choice(LOSS_REASONS) if stage == "closed_lost" else None,
                             closed_on=close.isoformat() if stage.startswith("closed") else None,
                             created_at=_ts(created, 15), updated_at=None))

    # ---- quotes (hand-written ones for the acting rep, then generated) --------------------
    # id, opportunity, status, valid until, created, [(product, qty, discount)]
    fixed_quotes = [
        (1, 13, "accepted", "2025-10-15", "2025-09-10", [(1, 120, 0)]),
        (2, 3, "accepted", "2026-03-15", "2026-02-09", [(2, 50, 0), (4, 25, 0)]),
        (3, 5, "accepted", "2026-01-31", "2025-12-18", [(3, 16, 0)]),
        (4, 1, "sent", "2026-04-30", "2026-02-24", [(2, 90, 0), (5, 90, 15)]),
        (5, 8, "rejected", "2026-02-28", "2026-01-22", [(3, 80, 0), (8, 1, 0), (12, 1, 0)]),
        (6, 8, "sent", "2026-04-15", "2026-03-03", [(3, 60, 5), (8, 1, 0), (12, 1, 0), (16, 1, 0)]),
        (7, 4, "draft", "2026-06-30", "2026-03-10", [(3, 100, 10), (15, 1, 0), (12, 1, 0), (17, 1, 0)]),
        (8, 12, "accepted", "2026-03-31", "2026-02-20", [(12, 1, 0), (14, 2, 0)]),
        (9, 9, "sent", "2026-05-29", "2026-02-27", [(1, 75, 0), (11, 1, 0), (14, 1, 0)]),
    ]
    seat_for = {"enterprise": 3, "mid_market": 2, "smb": 1}
    qid = len(fixed_quotes)
    quote_specs = list(fixed_quotes)
    for o in opps[len(fixed_opps):]:
        if o["stage"] not in ("proposal", "negotiation", "closed_won") or rng.random() < 0.45:
            continue
        qid += 1
        seg = segment_of_team[team_of[o["owner_id"]]]
        seat = seat_for[seg]
        qty = max(5, int(o["amount"] * 0.8 // PRICE[seat]))
        lines = [(seat, qty, rng.choice([0, 0, 5, 10]))]
        for extra in rng.sample([4, 5, 8, 11, 13, 14, 16], rng.randint(1, 2)):
            per_seat = extra in (4, 5)
            lines.append((extra, qty if per_seat else 1, rng.choice([0, 0, 10])))
        status = {"proposal": "sent", "negotiation": "sent", "closed_won": "accepted"}[o["stage"]]
        if o["stage"] == "proposal" and rng.random() < 0.3:
            status = "draft"
        closeish = _d(o["expected_close_date"])
        created = min(closeish, LAST_DAY) - timedelta(days=rng.randint(10, 30))
        quote_specs.append((qid, o["id"], status, (closeish + timedelta(days=14)).isoformat(),
                            created.isoformat(), lines))
        total = sum(PRICE[p] * q * (100 - d) / 100 for p, q, d in lines)
        o["amount"] = round(total, 2)  # the deal is worth what was quoted
    quotes, quote_lines = [], []
    lid = 0
    owner_of_opp = {o["id"]: o["owner_id"] for o in opps}
    for qid, opp_id, status, valid, created, lines in quote_specs:
        c = _d(created)
        quotes.append(dict(id=qid, quote_number=f"Q-{qid:05d}", opportunity_id=opp_id, status=status,
                           valid_until=valid, notes=None, created_by=owner_of_opp[opp_id],
                           created_at=_ts(c, 13),
                           sent_at=_ts(c + timedelta(days=1), 9) if status != "draft" else None,
                           decided_at=_ts(c + timedelta(days=6), 16)
                           if status in ("accepted", "rejected") else None))
        for product, qty, disc in lines:
            lid += 1
            quote_lines.append(dict(id=lid, quote_id=qid, product_id=product, quantity=qty,
                                    unit_price=PRICE[product], discount_pct=disc))
    quotes[1]["notes"] = "Renewal at 2025 list prices, analytics for the finance team."
    quotes[5]["notes"] = "Revised after procurement feedback: 60 seats, 5% volume discount."

    for o in opps:
        last = _d(o["closed_on"]) if o["closed_on"] else LAST_DAY - timedelta(days=(o["id"] * 3) % 20)
        o["updated_at"] = _ts(max(last, _d(o["created_at"][:10])), 17)
    out.append(("opportunities", opps))

    # ---- leads -------------------------------------------------------------------------
    # id, first, last, title, company, domain, source, status, owner, created, reason
    fixed_leads = [
        (1, "Dana", "Whitfield", "Director of Operations", "Harborview Dental Group", "harborviewdental.com", "webinar", "qualified", 1, "2026-02-12", None),
        (2, "Derek", "Hale", "Fleet Systems Manager", "Northwind Logistics", "northwindlogistics.com", "referral", "qualified", 1, "2026-02-25", None),
        (3, "Tom", "Becker", "Operations Director", "Ridgeway Builders", "ridgewaybuilders.com", "trade_show", "contacted", 1, "2026-01-30", None),
        (4, "Paula", "Winters", "Director of Admissions", "Lumen Learning Co", "lumenlearning.co", "webinar", "converted", 1, "2026-01-20", None),
        (5, "Irene", "Castillo", "VP of Sales", "Solano Vineyards", "solanovineyards.com", "website", "new", 1, "2026-03-11", None),
        (6, "Marco", "Bianchi", "IT Director", "Coastal Cold Storage", "coastalcold.com", "trade_show", "new", 1, "2026-03-09", None),
        (7, "Heather", "Lyons", "COO", "Sierra Ski Resorts", "sierraski.com", "cold_outreach", "contacted", 1, "2026-02-17", None),
        (8, "Gavin", "Roth", "Procurement Manager", "Delta Mechanical", "deltamech.com", "partner", "unqualified", 1, "2025-12-08", "Under 20 users, referred to SMB team"),
    ]
    lead_companies = [
        ("Aurora Biotech", "aurorabio.com"), ("Bramble & Co Interiors", "brambleco.com"),
        ("Cobalt Security Systems", "cobaltsec.com"), ("Driftwood Marinas", "driftwoodmarinas.com"),
        ("Emberline Catering", "emberline.com"), ("Foxglove Pharmacy", "foxglovepharmacy.com"),
        ("Glacier Point Outdoor", "glacierpoint.com"), ("Hollow Oak Winery", "hollowoak.com"),
        ("Indigo Print Works", "indigoprint.com"), ("Juniper Senior Living", "junipersl.com"),
        ("Kingfisher Aviation", "kingfisheraviation.com"), ("Larkspur Dental", "larkspurdental.com"),
        ("Maplewood School District", "maplewoodsd.org"), ("Nimbus Cloud Hosting", "nimbushost.io"),
        ("Onyx Fabrication", "onyxfab.com"), ("Pelican Bay Resorts", "pelicanbay.com"),
        ("Quill & Ledger Accounting", "quillledger.com"), ("Rosewood Property Mgmt", "rosewoodpm.com"),
        ("Saltmarsh Seafood", "saltmarshseafood.com"), ("Thistle Home Health", "thistlehh.com"),
        ("Umber Coffee Roasters", "umbercoffee.com"), ("Vantage Solar", "vantagesolar.com"),
        ("Willow Creek Clinics", "willowcreekclinics.com"), ("Yellowstone Freight", "ysfreight.com"),
    ]
    reps = [u[0] for u in USERS if u[2] == "rep" and u[5] and u[0] != 1]
    leads = []
    for (lid_, f, l, title, company, domain, source, status, owner, created, reason) in fixed_leads:
        leads.append(dict(id=lid_, first_name=f, last_name=l, title=title, company=company,
                          email=f"{f.lower()}.{l.lower()}@{domain}",
                          phone=f"(555) 010-{1000 + lid_ * 37}", source=source, status=status,
                          owner_id=owner, disqualify_reason=reason, converted_account_id=None,
                          converted_contact_id=None, converted_opportunity_id=None,
                          converted_at=None, created_at=_ts(_d(created), 8, 30)))
    # lead 4 became the Lumen Learning account, its primary contact and opportunity 10
    leads[3].update(converted_account_id=8, converted_contact_id=contacts_by_account[8][0],
                    converted_opportunity_id=10, converted_at=_ts(date(2026, 2, 18), 15))
    lead_statuses = [("new", 35), ("contacted", 30), ("qualified", 15), ("unqualified", 20)]
    sources = ["website", "referral", "trade_show", "webinar", "cold_outreach", "partner"]
    lead_id = len(leads)
    for company, domain in lead_companies:
        lead_id += 1
        f, l = rng.choice(FIRST), rng.choice(LAST)
        status = rng.choices([s for s, _ in lead_statuses], [w for _, w in lead_statuses])[0]
        created = date(2025, 11, 1) + timedelta(days=rng.randint(0, 134))
        leads.append(dict(id=lead_id, first_name=f, last_name=l, title=rng.choice(TITLES),
                          company=company, email=f"{f.lower()}.{l.lower().replace(chr(39), '')}@{domain}",
                          phone=f"(555) 010-{1000 + lead_id * 37}", source=rng.choice(sources),
                          status=status, owner_id=rng.choice(reps),
                          disqualify_reason=rng.choice(["Too small", "No budget", "Existing vendor contract until 2028", "Not a decision maker"]) if status == "unqualified" else None,
                          converted_account_id=None, converted_contact_id=None,
                          converted_opportunity_id=None, converted_at=None,
                          created_at=_ts(created, 8, 30)))
    out.append(("leads", leads))

    # ---- stage history -----------------------------------------------------------------
    history = []
    hid = 0
    for o in opps:
        stage = o["stage"]
        if stage == "closed_won":
            path = STAGES + ["closed_won"]
        elif stage == "closed_lost":
            reached = STAGES[: rng.randint(1, 4)]
            path = reached + ["closed_lost"]
        else:
            path = STAGES[: STAGES.index(stage) + 1]
        start = _d(o["created_at"][:10])
        end = _d(o["closed_on"]) if o["closed_on"] else max(start, LAST_DAY - timedelta(days=(o["id"] * 5) % 25))
        span = max((end - start).days, len(path))
        prev = None
        for i, to_stage in enumerate(path):
            hid += 1
            when = start + timedelta(days=span * i // max(len(path) - 1, 1)) if i else start
            history.append(dict(id=hid, opportunity_id=o["id"], from_stage=prev, to_stage=to_stage,
                                changed_by=o["owner_id"], changed_at=_ts(when, 12 + i % 5)))
            prev = to_stage
    out.append(("opportunity_stage_history", history))
    out.append(("quotes", quotes))
    out.append(("quote_lines", quote_lines))

    # ---- activities --------------------------------------------------------------------
    nw = contacts_by_account[1]
    fixed_acts = [
        ("call", "Q1 kickoff call", 1, 1, nw[0], 1, "2026-01-28T16:00", 30),
        ("call", "Check-in on seat expansion", 1, 1, nw[0], 1, "2026-02-03T17:30", 25),
        ("email", "Sent expansion proposal", 1, 1, nw[0], 1, "2026-02-05T15:10", None),
        ("meeting", "Expansion scoping workshop", 1, 1, nw[1], 1, "2026-02-11T18:00", 90),
        ("call", "Analytics add-on discovery", 1, 1, nw[1], 2, "2026-02-19T16:45", 40),
        ("call", "Pricing question while Jordan was out", 3, 1, nw[2], 1, "2026-02-20T19:00", 15),
        ("call", "Follow-up on procurement timeline", 1, 1, nw[2], 1, "2026-02-26T17:00", 20),
        ("note", "Procurement needs a security review before signature", 1, 1, None, 1, "2026-02-27T09:00", None),
        ("call", "Procurement call", 1, 1, nw[2], 1, "2026-03-04T16:30", 35),
        ("meeting", "Executive sponsor lunch", 1, 6, contacts_by_account[6][0], 8, "2026-02-18T20:00", 75),
        ("email", "Revised quote sent", 1, 6, contacts_by_account[6][0], 8, "2026-03-04T14:00", None),
        ("call", "Redlines walkthrough", 1, 6, contacts_by_account[6][1], 8, "2026-03-10T17:00", 45),
        ("meeting", "Rollout architecture review", 1, 3, contacts_by_account[3][1], 4, "2026-03-05T18:00", 120),
        ("call", "Discovery call", 1, 4, contacts_by_account[4][0], 6, "2026-02-10T16:00", 30),
        ("email", "Sent Cedar Ridge case studies", 1, 4, contacts_by_account[4][0], 6, "2026-02-12T15:00", None),
        ("call", "Budget check with finance", 1, 7, contacts_by_account[7][1], 9, "2026-03-02T16:00", 20),
        ("email", "Renewal paperwork signed", 1, 2, contacts_by_account[2][0], 3, "2026-02-27T21:00", None),
    ]
    acts = []
    aid_ = 0
    for typ, subject, user, acct, contact, opp, when, dur in fixed_acts:
        aid_ += 1
        acts.append(dict(id=aid_, type=typ, subject=subject, body=None, user_id=user,
                         account_id=acct, contact_id=contact, opportunity_id=opp, lead_id=None,
                         duration_minutes=dur, occurred_at=when + ":00+00:00"))
    acts.append(dict(id=aid_ + 1, type="call", subject="Intro call at the Builders Expo booth",
                     body="Interested in field mobile, asked to talk again in Q2.", user_id=1,
                     account_id=None, contact_id=None, opportunity_id=None, lead_id=3,
                     duration_minutes=15, occurred_at="2026-02-04T18:20:00+00:00"))
    aid_ += 1
    subjects = {"call": ["Discovery call", "Follow-up call", "Pricing discussion", "Check-in call",
                         "Renewal call"],
                "email": ["Sent proposal", "Shared case study", "Sent meeting recap",
                          "Answered security questions"],
                "meeting": ["Product demo", "Onsite workshop", "Executive briefing",
                            "Quarterly business review"],
                "note": ["Champion changing roles", "Budget approved for Q2",
                         "Competitor also in the deal", "Legal review pending"]}
    other_opps = [o for o in opps if o["owner_id"] != 1 and o["account_id"] != 1]
    for _ in range(80):
        aid_ += 1
        o = rng.choice(other_opps)
        typ = rng.choice(["call", "call", "email", "email", "meeting", "note"])
        start = _d(o["created_at"][:10])
        end = _d(o["closed_on"]) if o["closed_on"] else LAST_DAY
        when = start + timedelta(days=rng.randint(0, max((end - start).days, 0)))
        acts.append(dict(id=aid_, type=typ, subject=rng.choice(subjects[typ]), body=None,
                         user_id=o["owner_id"], account_id=o["account_id"],
                         contact_id=None if typ == "note" else rng.choice(contacts_by_account[o["account_id"]]),
                         opportunity_id=o["id"], lead_id=None,
                         duration_minutes={"call": rng.choice([10, 15, 20, 30, 45]),
                                           "meeting": rng.choice([30, 45, 60, 90])}.get(typ),
                         occurred_at=_ts(when, rng.randint(14, 22), rng.choice([0, 15, 30, 45]))))
    out.append(("activities", acts))

    # ---- tasks -------------------------------------------------------------------------
    # id, title, due, priority, status, assigned, created by, account, opportunity, lead, created
    fixed_tasks = [
        (1, "Send security questionnaire to Cedar Ridge IT", "2026-03-20", "normal", "open", 1, 1, 4, 6, None, "2026-02-10"),
        (2, "Discovery call with Cedar Ridge", "2026-02-10", "normal", "completed", 1, 1, 4, 6, None, "2026-02-03"),
        (3, "Follow up on Tidewater redlines", "2026-03-12", "high", "open", 1, 1, 6, 8, None, "2026-03-05"),
        (4, "Prepare Kestrel rollout pricing", "2026-03-10", "high", "open", 1, 1, 3, 4, None, "2026-03-01"),
        (5, "Renewal kickoff with Brightlane", "2026-03-27", "normal", "open", 1, 1, 2, None, None, "2026-03-02"),
        (6, "Send Ironclad onboarding plan", "2026-03-13", "normal", "open", 1, 1, 7, 9, None, "2026-03-02"),
        (7, "Call back Tom Becker", "2026-03-05", "normal", "open", 1, 1, None, None, 3, "2026-02-04"),
        (8, "Quarterly review deck for Northwind", "2026-03-18", "normal", "open", 1, 1, 1, 1, None, "2026-03-06"),
        (9, "Collect Summit Peak mobile requirements", "2026-03-09", "low", "completed", 1, 1, 5, 7, None, "2026-03-02"),
        (10, "Schedule Ironclad support review", "2026-03-02", "low", "cancelled", 1, 1, 7, 11, None, "2026-02-20"),
        (11, "Prepare pipeline review notes", "2026-03-13", "normal", "open", 1, 2, None, None, None, "2026-03-09"),
        (12, "Book Lumen campus visit", "2026-03-24", "normal", "open", 1, 1, 8, 10, None, "2026-03-04"),
        (13, "First call with Dana Whitfield", "2026-02-16", "normal", "completed", 1, 1, None, None, 1, "2026-02-12"),
    ]
    tasks = []
    for (tid, title, due, prio, status, assigned, by, acct, opp, lead, created) in fixed_tasks:
        tasks.append(dict(id=tid, title=title, description=None, due_date=due, priority=prio,
                          status=status, assigned_to=assigned, created_by=by, account_id=acct,
                          contact_id=None, opportunity_id=opp, lead_id=lead,
                          created_at=_ts(_d(created), 9),
                          completed_at=_ts(_d(due), 17) if status == "completed" else None))
    task_titles = ["Send follow-up email", "Schedule demo", "Prepare proposal", "Confirm budget owner",
                   "Send contract for signature", "Book QBR", "Share onboarding timeline",
                   "Check in after trial", "Update close plan"]
    open_opps = [o for o in other_opps if not o["stage"].startswith("closed")]
    tid = len(tasks)
    for _ in range(36):
        tid += 1
        o = rng.choice(open_opps)
        due = date(2026, 2, 23) + timedelta(days=rng.randint(0, 45))
        status = "open" if due >= date(2026, 3, 10) else rng.choice(["open", "completed", "completed"])
        created = due - timedelta(days=rng.randint(3, 20))
        tasks.append(dict(id=tid, title=rng.choice(task_titles), description=None,
                          due_date=due.isoformat(), priority=rng.choice(["low", "normal", "normal", "high"]),
                          status=status, assigned_to=o["owner_id"], created_by=o["owner_id"],
                          account_id=o["account_id"], contact_id=None, opportunity_id=o["id"],
                          lead_id=None, created_at=_ts(created, 9),
                          completed_at=_ts(due, 17) if status == "completed" else None))
    out.append(("tasks", tasks))
    return out
