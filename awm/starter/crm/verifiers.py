"""Verifiers of the crm tasks: verify_<task id>(final, initial, answer) -> (bool, reason).

Records are looked up by their natural keys (names, emails, quote numbers) and compared with the
untouched snapshot (`initial`); question tasks recompute the expected value from the snapshot.
"""

import re

ME = 1
_NUMBER_WORDS = {"zero": 0, "no": 0, "none": 0, "one": 1, "two": 2, "three": 3, "four": 4,
                 "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
                 "eleven": 11, "twelve": 12}


def _norm(text):
    return re.sub(r"\s+", " ", str(text or "").strip().lower()).strip(" .!\"'")


def _numbers(text):
    """All numbers in a free-text answer: "$232,170.00" -> 232170.0, "15k" is not understood."""
    cleaned = re.sub(r"(?<=\d),(?=\d{3}\b)", "", str(text or ""))
    return [float(x) for x in re.findall(r"(?<![\d.])\d+(?:\.\d+)?", cleaned)]


def _has_amount(answer, value):
    return answer is not None and any(abs(n - float(value)) < 0.01 for n in _numbers(answer))


def _first_count(answer):
    """The first count stated in an answer, ignoring dates and years ("5 tasks", "five tasks")."""
    text = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", " ", str(answer or "").lower())
    text = re.sub(r"\b(19|20)\d{2}\b", " ", text)
    month = r"(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
    text = re.sub(rf"\b{month}\s+\d{{1,2}}(st|nd|rd|th)?\b", " ", text)
    text = re.sub(rf"\b\d{{1,2}}(st|nd|rd|th)?\s+(of\s+)?{month}", " ", text)
    for token in re.findall(r"[a-z]+|\d+", text):
        if token.isdigit():
            return int(token)
        if token in _NUMBER_WORDS:
            return _NUMBER_WORDS[token]
    return None


def _max_id(db, table):
    return db.scalar(f"SELECT COALESCE(max(id), 0) AS m FROM {table}")


def _opportunity(db, name):
    return db.one("SELECT * FROM opportunities WHERE lower(name) = lower(%s)", name)


def _account_id(db, name):
    return db.scalar("SELECT id FROM accounts WHERE lower(name) = lower(%s)", name)


def verify_convert_harborview_lead(final, initial, answer):
    email = "dana.whitfield@harborviewdental.com"
    lead = final.one("SELECT * FROM leads WHERE lower(email) = %s", email)
    if lead is None or lead["status"] != "converted":
        return False, "lead Dana Whitfield is not converted"
    if initial.scalar("SELECT id FROM accounts WHERE lower(name) = 'harborview dental group'"):
        return False, "snapshot already has the account"
    accounts = final.query("SELECT * FROM accounts WHERE id > %s", _max_id(initial, "accounts"))
    if len(accounts) != 1 or _norm(accounts[0]["name"]) != "harborview dental group":
        return False, f"expected exactly one new account 'Harborview Dental Group', got {len(accounts)}"
    account = accounts[0]
    if account["owner_id"] != ME or _norm(account["industry"]) != "healthcare":
        return False, f"new account has owner {account['owner_id']} / industry {account['industry']!r}"
    if lead["converted_account_id"] != account["id"]:
        return False, "lead is not linked to the new account"
    contact = final.one("SELECT * FROM contacts WHERE lower(email) = %s", email)
    if contact is None or contact["account_id"] != account["id"]:
        return False, "no contact for Dana Whitfield on the new account"
    if (contact["first_name"], contact["last_name"]) != ("Dana", "Whitfield"):
        return False, "contact name does not match the lead"
    if lead["converted_contact_id"] != contact["id"]:
        return False, "lead is not linked to the new contact"
    opps = final.query("SELECT * FROM opportunities WHERE account_id = %s", account["id"])
    if len(opps) != 1:
        return False, f"expected one opportunity on the new account, found {len(opps)}"
    opp = opps[0]
    if _norm(opp["name"]) != "harborview dental group - practice rollout":
        return False, f"opportunity name is {opp['name']!r}"
    if abs(float(opp["amount"]) - 42000) > 0.01 or opp["expected_close_date"] != "2026-06-30":
        return False, f"opportunity amount/close date is {opp['amount']} / {opp['expected_close_date']}"
    if opp["owner_id"] != ME or opp["stage"] != "prospecting":
        return False, f"opportunity owner/stage is {opp['owner_id']} / {opp['stage']}"
    if lead["converted_opportunity_id"] not in (None, opp["id"]):
        return False, "lead is linked to a different opportunity"
    return True, "lead converted into account, contact and the requested opportunity"


def verify_convert_derek_into_northwind(final, initial, answer):
    email = "derek.hale@northwindlogistics.com"
    northwind = _account_id(initial, "Northwind Logistics")
    lead = final.one("SELECT * FROM leads WHERE lower(email) = %s", email)
    if lead is None or lead["status"] != "converted":
        return False, "lead Derek Hale is not converted"
    if lead["converted_account_id"] != northwind:
        return False, f"lead converted into account {lead['converted_account_id']}, not Northwind"
    if lead["converted_opportunity_id"] is not None:
        return False, "an opportunity was created during the conversion"
    if final.scalar("SELECT count(*) FROM accounts") != initial.scalar("SELECT count(*) FROM accounts"):
        return False, "a new account was created"
    if final.scalar("SELECT count(*) FROM opportunities") != initial.scalar("SELECT count(*) FROM opportunities"):
        return False, "an opportunity was created"
    contact = final.one("SELECT * FROM contacts WHERE lower(email) = %s", email)
    if contact is None or contact["account_id"] != northwind:
        return False, "Derek Hale is not a contact at Northwind Logistics"
    primary = "SELECT id FROM contacts WHERE account_id = %s AND is_primary"
    if final.scalar(primary, northwind) != initial.scalar(primary, northwind):
        return False, "Northwind's primary contact changed"
    return True, "Derek Hale converted into a Northwind Logistics contact"


def verify_advance_kestrel_to_negotiation(final, initial, answer):
    name = "Kestrel Aerospace - Enterprise rollout"
    before, opp = _opportunity(initial, name), _opportunity(final, name)
    if opp is None or before is None:
        return False, "opportunity not found"
    if opp["stage"] != "negotiation" or opp["probability"] != 75:
        return False, f"opportunity is in {opp['stage']} ({opp['probability']}%)"
    history = final.query("SELECT * FROM opportunity_stage_history WHERE id > %s AND opportunity_id = %s",
                          _max_id(initial, "opportunity_stage_history"), opp["id"])
    if [(h["from_stage"], h["to_stage"]) for h in history] != [(before["stage"], "negotiation")]:
        return False, f"unexpected stage history entries: {history}"
    calls = final.query("SELECT * FROM activities WHERE id > %s AND opportunity_id = %s AND type = 'call'",
                        _max_id(initial, "activities"), opp["id"])
    calls = [c for c in calls if _norm(c["subject"]) == "pricing review with procurement"]
    if len(calls) != 1:
        return False, f"expected one new call 'Pricing review with procurement', found {len(calls)}"
    if calls[0]["user_id"] != ME or calls[0]["duration_minutes"] != 30:
        return False, f"call logged by {calls[0]['user_id']} lasting {calls[0]['duration_minutes']} min"
    return True, "moved to negotiation and call logged"


def verify_close_cedar_ridge_lost(final, initial, answer):
    name = "Cedar Ridge Health - Patient outreach platform"
    opp = _opportunity(final, name)
    if opp is None or opp["stage"] != "closed_lost":
        return False, "opportunity is not closed lost"
    if "chose competitor" not in _norm(opp["loss_reason"]):
        return False, f"loss reason is {opp['loss_reason']!r}"
    before = {t["id"]: t for t in initial.query("SELECT id, status, opportunity_id FROM tasks")}
    after = {t["id"]: t for t in final.query("SELECT id, status, opportunity_id FROM tasks")}
    targets = [i for i, t in before.items() if t["opportunity_id"] == opp["id"] and t["status"] == "open"]
    if not targets:
        return False, "snapshot has no open task on the opportunity"
    for task_id in targets:
        if after[task_id]["status"] != "cancelled":
            return False, f"task {task_id} is {after[task_id]['status']}, not cancelled"
    changed = [i for i, t in before.items() if i not in targets and after[i]["status"] != t["status"]]
    if changed:
        return False, f"other tasks changed status: {changed}"
    return True, "closed lost and its open tasks cancelled"


def verify_quote_lumen_pilot(final, initial, answer):
    opp = _opportunity(final, "Lumen Learning Co - Campus pilot")
    quotes = final.query("SELECT * FROM quotes WHERE id > %s AND opportunity_id = %s",
                         _max_id(initial, "quotes"), opp["id"])
    if len(quotes) != 1:
        return False, f"expected one new quote for the opportunity, found {len(quotes)}"
    quote = quotes[0]
    if quote["status"] != "sent" or quote["valid_until"] != "2026-05-31":
        return False, f"quote is {quote['status']}, valid until {quote['valid_until']}"
    lines = final.query("SELECT l.*, p.sku, p.unit_price AS list_price FROM quote_lines l "
                        "JOIN products p ON p.id = l.product_id WHERE l.quote_id = %s", quote["id"])
    if len(lines) != 1:
        return False, f"quote has {len(lines)} lines, expected 1"
    line = lines[0]
    if line["sku"] != "CRM-STD-SEAT" or line["quantity"] != 30:
        return False, f"line is {line['quantity']} x {line['sku']}"
    if abs(float(line["discount_pct"]) - 10) > 0.001 or line["unit_price"] != line["list_price"]:
        return False, f"line discount {line['discount_pct']}% at {line['unit_price']}"
    return True, "quote with 30 Standard seats at 10% created and sent"


def verify_win_tidewater_deal(final, initial, answer):
    quote = final.one("SELECT * FROM quotes WHERE quote_number = 'Q-00006'")
    if quote is None or quote["status"] != "accepted":
        return False, "quote Q-00006 is not accepted"
    opp = final.one("SELECT * FROM opportunities WHERE id = %s", quote["opportunity_id"])
    if opp["stage"] != "closed_won" or opp["probability"] != 100:
        return False, f"opportunity is {opp['stage']}"
    total = final.scalar("SELECT ROUND(SUM(quantity * unit_price * (100 - discount_pct) / 100), 2) "
                         "FROM quote_lines WHERE quote_id = %s", quote["id"])
    if abs(float(opp["amount"]) - float(total)) > 0.01:
        return False, f"opportunity amount {opp['amount']} differs from the accepted quote {total}"
    old = final.scalar("SELECT status FROM quotes WHERE quote_number = 'Q-00005'")
    if old != "rejected":
        return False, f"older quote Q-00005 is now {old}"
    return True, "quote accepted and deal won at the quoted amount"


def verify_hand_over_ironclad(final, initial, answer):
    name = "Ironclad Construction - Field team seats"
    sam = final.scalar("SELECT id FROM users WHERE full_name = 'Sam Okafor'")
    before, opp = _opportunity(initial, name), _opportunity(final, name)
    if before["owner_id"] != ME:
        return False, "snapshot: opportunity not owned by the acting rep"
    if opp["owner_id"] != sam:
        return False, f"opportunity is owned by user {opp['owner_id']}, not Sam Okafor"
    if opp["stage"] != before["stage"] or opp["amount"] != before["amount"]:
        return False, "opportunity stage or amount changed"
    tasks = final.query("SELECT * FROM tasks WHERE id > %s", _max_id(initial, "tasks"))
    tasks = [t for t in tasks if _norm(t["title"]) == "intro call with ironclad construction"]
    if len(tasks) != 1:
        return False, f"expected one new task 'Intro call with Ironclad Construction', found {len(tasks)}"
    task = tasks[0]
    want = {"assigned_to": sam, "opportunity_id": opp["id"], "due_date": "2026-04-10",
            "priority": "high", "status": "open"}
    wrong = {k: task[k] for k, v in want.items() if task[k] != v}
    if wrong:
        return False, f"task fields differ: {wrong}"
    return True, "opportunity handed to Sam with an intro task"


def verify_brightlane_new_primary_contact(final, initial, answer):
    account = _account_id(initial, "Brightlane Foods")
    contact = final.one("SELECT * FROM contacts WHERE lower(email) = 'elena.marsh@brightlanefoods.com'")
    if contact is None or contact["account_id"] != account:
        return False, "Elena Marsh is not a contact at Brightlane Foods"
    if (contact["first_name"], contact["last_name"]) != ("Elena", "Marsh"):
        return False, f"name is {contact['first_name']} {contact['last_name']}"
    if _norm(contact["title"]) != "vp of operations":
        return False, f"title is {contact['title']!r}"
    if re.sub(r"\D", "", contact["phone"] or "")[-10:] != "5035550148":
        return False, f"phone is {contact['phone']!r}"
    if not contact["is_primary"]:
        return False, "Elena Marsh is not the primary contact"
    old = initial.scalar("SELECT id FROM contacts WHERE account_id = %s AND is_primary", account)
    old_now = final.one("SELECT * FROM contacts WHERE id = %s", old)
    if old_now is None or old_now["is_primary"]:
        return False, "the previous primary contact was removed or is still primary"
    if final.scalar("SELECT count(*) FROM contacts WHERE account_id = %s", account) != \
            initial.scalar("SELECT count(*) FROM contacts WHERE account_id = %s", account) + 1:
        return False, "expected exactly one new contact at Brightlane Foods"
    return True, "Elena Marsh added as primary contact"


def verify_disqualify_ridgeway_lead(final, initial, answer):
    lead = final.one("SELECT * FROM leads WHERE lower(email) = 'tom.becker@ridgewaybuilders.com'")
    if lead is None or lead["status"] != "unqualified":
        return False, f"lead status is {lead and lead['status']}"
    if "no budget in 2026" not in _norm(lead["disqualify_reason"]):
        return False, f"reason is {lead['disqualify_reason']!r}"
    notes = final.query("SELECT * FROM activities WHERE id > %s AND lead_id = %s AND type = 'note' "
                        "AND user_id = %s", _max_id(initial, "activities"), lead["id"], ME)
    if not any(_norm(n["subject"]) == "not interested this year" for n in notes):
        return False, "no note 'Not interested this year' on the lead"
    return True, "lead disqualified and note logged"


def verify_push_northwind_close_dates(final, initial, answer):
    account = _account_id(initial, "Northwind Logistics")
    sql = "SELECT * FROM opportunities WHERE account_id = %s ORDER BY id"
    before = initial.query(sql, account)
    after = {o["id"]: o for o in final.query(sql, account)}
    open_ids = [o["id"] for o in before if o["stage"] not in ("closed_won", "closed_lost")]
    if not open_ids:
        return False, "snapshot has no open Northwind opportunity"
    for o in before:
        now = after[o["id"]]
        if o["id"] in open_ids:
            if now["expected_close_date"] != "2026-06-30":
                return False, f"opportunity {o['id']} closes {now['expected_close_date']}"
            if (now["stage"], now["amount"], now["owner_id"]) != (o["stage"], o["amount"], o["owner_id"]):
                return False, f"opportunity {o['id']} changed more than its close date"
        elif now["expected_close_date"] != o["expected_close_date"]:
            return False, f"closed opportunity {o['id']} was changed"
    return True, "all open Northwind opportunities now close on 2026-06-30"


def verify_negotiation_pipeline_total(final, initial, answer):
    total = initial.scalar("SELECT COALESCE(SUM(amount), 0) FROM opportunities "
                           "WHERE owner_id = %s AND stage = 'negotiation'", ME)
    if _has_amount(answer, total):
        return True, f"answer contains {total}"
    return False, f"answer does not contain the total {total}"


def verify_team_top_closer_q1(final, initial, answer):
    rows = initial.query(
        "SELECT u.full_name, SUM(o.amount) AS total FROM opportunities o "
        "JOIN users u ON u.id = o.owner_id WHERE u.team_id = (SELECT team_id FROM users WHERE id = %s) "
        "AND o.stage = 'closed_won' AND o.closed_on BETWEEN '2026-01-01' AND '2026-03-31' "
        "GROUP BY u.full_name ORDER BY total DESC", ME)
    top = rows[0]
    if answer is None or top["full_name"].lower() not in answer.lower():
        return False, f"answer does not name {top['full_name']}"
    if not _has_amount(answer, top["total"]):
        return False, f"answer does not contain {top['total']}"
    return True, f"{top['full_name']} with {top['total']}"


def verify_kestrel_quote_discount(final, initial, answer):
    row = initial.one(
        "SELECT ROUND(SUM(l.quantity * l.unit_price * l.discount_pct / 100), 2) AS discount, "
        "ROUND(SUM(l.quantity * l.unit_price * (100 - l.discount_pct) / 100), 2) AS total "
        "FROM quote_lines l JOIN quotes q ON q.id = l.quote_id WHERE q.quote_number = 'Q-00007'")
    if not _has_amount(answer, row["discount"]):
        return False, f"answer does not contain the discount {row['discount']}"
    if not _has_amount(answer, row["total"]):
        return False, f"answer does not contain the total {row['total']}"
    return True, f"discount {row['discount']}, total {row['total']}"


def verify_overdue_task_count(final, initial, answer):
    count = initial.scalar("SELECT count(*) FROM tasks WHERE assigned_to = %s AND status = 'open' "
                           "AND due_date < '2026-03-16'", ME)
    stated = _first_count(answer)
    if stated == count:
        return True, f"answer states {count}"
    return False, f"expected {count}, answer states {stated}"


def verify_tidewater_primary_contact(final, initial, answer):
    contact = initial.one("SELECT c.* FROM contacts c JOIN accounts a ON a.id = c.account_id "
                          "WHERE a.name = 'Pacific Tidewater Bank' AND c.is_primary")
    text = (answer or "").lower()
    if contact["email"].lower() not in text:
        return False, f"answer does not contain {contact['email']}"
    if contact["first_name"].lower() not in text or contact["last_name"].lower() not in text:
        return False, "answer does not give the contact's full name"
    return True, f"{contact['first_name']} {contact['last_name']}"


def verify_northwind_february_calls(final, initial, answer):
    count = initial.scalar(
        "SELECT count(*) FROM activities a JOIN accounts ac ON ac.id = a.account_id "
        "WHERE ac.name = 'Northwind Logistics' AND a.user_id = %s AND a.type = 'call' "
        "AND (a.occurred_at AT TIME ZONE 'UTC')::date BETWEEN '2026-02-01' AND '2026-02-28'", ME)
    stated = _first_count(answer)
    if stated == count:
        return True, f"answer states {count}"
    return False, f"expected {count}, answer states {stated}"
