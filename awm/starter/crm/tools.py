"""Tools of the B2B sales CRM. The agent is the sales rep with user id 1 (Jordan Reyes).

Reads are open to everyone; changes follow the usual CRM rules: you can only change accounts,
leads, opportunities and quotes you own, opportunities move through the pipeline one stage at a
time, quotes go draft -> sent -> accepted/rejected, and discounts above 20% need a manager.
"""

import re
from datetime import date, datetime
from typing import Literal

ME = 1  # the acting sales rep (Jordan Reyes)
OPEN_STAGES = ["prospecting", "qualification", "proposal", "negotiation"]
STAGE_PROBABILITY = {"prospecting": 10, "qualification": 20, "proposal": 50, "negotiation": 75,
                     "closed_won": 100, "closed_lost": 0}
MAX_REP_DISCOUNT = 20
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[A-Za-z]{2,}$")
_QUOTE_TOTAL = ("COALESCE(ROUND(SUM(l.quantity * l.unit_price * (100 - l.discount_pct) / 100), 2), 0)")


def _date(value, field):
    try:
        return date.fromisoformat(value.strip()).isoformat()
    except (ValueError, AttributeError):
        raise ToolError(f"{field} must be a date in YYYY-MM-DD format, got {value!r}")


def _datetime(value, field):
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        raise ToolError(f"{field} must be an ISO date-time like 2026-03-16T14:30:00, got {value!r}")
    if parsed.tzinfo is None:
        return parsed.isoformat() + "+00:00"
    return parsed.isoformat()


def _limit(limit, maximum=100):
    if limit < 1 or limit > maximum:
        raise ToolError(f"limit must be between 1 and {maximum}")
    return limit


def _email(value):
    value = value.strip()
    if not _EMAIL.match(value):
        raise ToolError(f"{value!r} is not a valid email address")
    return value


def _text(value, field):
    value = (value or "").strip()
    if not value:
        raise ToolError(f"{field} must not be empty")
    return value


def _user(db, user_id):
    row = db.one("SELECT id, full_name, role, team_id, is_active FROM users WHERE id = %s", user_id)
    if row is None:
        raise ToolError(f"User {user_id} not found")
    return row


def _account(db, account_id):
    row = db.one("SELECT a.*, u.full_name AS owner_name FROM accounts a "
                 "JOIN users u ON u.id = a.owner_id WHERE a.id = %s", account_id)
    if row is None:
        raise ToolError(f"Account {account_id} not found")
    return row


def _contact(db, contact_id):
    row = db.one("SELECT * FROM contacts WHERE id = %s", contact_id)
    if row is None:
        raise ToolError(f"Contact {contact_id} not found")
    return row


def _lead(db, lead_id):
    row = db.one("SELECT l.*, u.full_name AS owner_name FROM leads l "
                 "JOIN users u ON u.id = l.owner_id WHERE l.id = %s", lead_id)
    if row is None:
        raise ToolError(f"Lead {lead_id} not found")
    return row


def _opportunity(db, opportunity_id):
    row = db.one("SELECT o.*, a.name AS account_name, u.full_name AS owner_name "
                 "FROM opportunities o JOIN accounts a ON a.id = o.account_id "
                 "JOIN users u ON u.id = o.owner_id WHERE o.id = %s", opportunity_id)
    if row is None:
        raise ToolError(f"Opportunity {opportunity_id} not found")
    return row


def _quote(db, quote_id):
    row = db.one("SELECT q.*, o.name AS opportunity_name, o.owner_id, o.stage AS opportunity_stage "
                 "FROM quotes q JOIN opportunities o ON o.id = q.opportunity_id WHERE q.id = %s",
                 quote_id)
    if row is None:
        raise ToolError(f"Quote {quote_id} not found")
    return row


def _quote_total(db, quote_id):
    return db.scalar(f"SELECT {_QUOTE_TOTAL} AS total FROM quote_lines l WHERE l.quote_id = %s",
                     quote_id)


def _task(db, task_id):
    row = db.one("SELECT * FROM tasks WHERE id = %s", task_id)
    if row is None:
        raise ToolError(f"Task {task_id} not found")
    return row


def _require_owner(row, what):
    if row["owner_id"] != ME:
        raise ToolError(f"{what} is owned by {row.get('owner_name') or 'user ' + str(row['owner_id'])} "
                        f"(user {row['owner_id']}); only the owner can change it")


def _require_open(opp):
    if opp["stage"] in ("closed_won", "closed_lost"):
        raise ToolError(f"Opportunity {opp['id']} is already {opp['stage']}; closed opportunities "
                        "cannot be changed")


def _where(conditions):
    return (" WHERE " + " AND ".join(conditions)) if conditions else ""


def _record_stage(db, opportunity_id, from_stage, to_stage):
    db.execute("INSERT INTO opportunity_stage_history (opportunity_id, from_stage, to_stage, "
               "changed_by, changed_at) VALUES (%s, %s, %s, %s, now())",
               opportunity_id, from_stage, to_stage, ME)


def _check_links(db, account_id, contact_id, opportunity_id, lead_id):
    """Validate the records a task or activity is linked to; returns the resolved account id."""
    if lead_id is not None:
        _lead(db, lead_id)
        if account_id is not None or contact_id is not None or opportunity_id is not None:
            raise ToolError("link to either a lead or to account records (account, contact, "
                            "opportunity), not both")
        return None
    if opportunity_id is not None:
        opp = _opportunity(db, opportunity_id)
        if account_id is not None and account_id != opp["account_id"]:
            raise ToolError(f"Opportunity {opportunity_id} belongs to account {opp['account_id']}, "
                            f"not {account_id}")
        account_id = opp["account_id"]
    if contact_id is not None:
        contact = _contact(db, contact_id)
        if account_id is not None and account_id != contact["account_id"]:
            raise ToolError(f"Contact {contact_id} works at account {contact['account_id']}, "
                            f"not account {account_id}")
        account_id = contact["account_id"]
    if account_id is not None:
        _account(db, account_id)
    return account_id


# ------------------------------------------------------------------------------------------
# Read tools
# ------------------------------------------------------------------------------------------

def get_my_profile(db) -> dict:
    """Show who you are: your user record (you are user 1), team, manager and quarterly quota."""
    me = db.one("SELECT u.id, u.full_name, u.email, u.role, u.team_id, t.name AS team_name, "
                "u.quarterly_quota FROM users u LEFT JOIN teams t ON t.id = u.team_id "
                "WHERE u.id = %s", ME)
    me["manager"] = db.one("SELECT id, full_name, email FROM users WHERE team_id = %s "
                           "AND role = 'manager' AND is_active ORDER BY id LIMIT 1", me["team_id"])
    return me


def list_users(db, query: str | None = None, team_id: int | None = None,
               role: Literal["rep", "manager", "sales_ops"] | None = None,
               include_inactive: bool = False, limit: int = 50) -> list:
    """List sales users (reps, managers, sales ops) with their team.

    Args:
        query: Part of the user's name or email (case-insensitive).
        team_id: Only users on this team.
        role: Only users with this role.
        include_inactive: Also list users who have left the company.
        limit: Maximum number of users to return (1-100).
    """
    cond, params = [], []
    if query:
        cond.append("(u.full_name ILIKE %s OR u.email ILIKE %s)")
        params += [f"%{query.strip()}%"] * 2
    if team_id is not None:
        cond.append("u.team_id = %s")
        params.append(team_id)
    if role:
        cond.append("u.role = %s")
        params.append(role)
    if not include_inactive:
        cond.append("u.is_active")
    params.append(_limit(limit))
    return db.query("SELECT u.id, u.full_name, u.email, u.role, u.team_id, t.name AS team_name, "
                    "u.is_active FROM users u LEFT JOIN teams t ON t.id = u.team_id"
                    + _where(cond) + " ORDER BY u.id LIMIT %s", *params)


def search_accounts(db, query: str | None = None, industry: str | None = None,
                    type: Literal["prospect", "customer", "partner", "churned"] | None = None,
                    owner_id: int | None = None, limit: int = 20) -> list:
    """Search company accounts by name, website or city.

    Args:
        query: Part of the account name, website or city (case-insensitive).
        industry: Exact industry, e.g. "Healthcare" (case-insensitive).
        type: Account type.
        owner_id: Only accounts owned by this user (you are user 1).
        limit: Maximum number of accounts to return (1-100).
    """
    cond, params = [], []
    if query:
        cond.append("(a.name ILIKE %s OR a.website ILIKE %s OR a.city ILIKE %s)")
        params += [f"%{query.strip()}%"] * 3
    if industry:
        cond.append("lower(a.industry) = lower(%s)")
        params.append(industry.strip())
    if type:
        cond.append("a.type = %s")
        params.append(type)
    if owner_id is not None:
        cond.append("a.owner_id = %s")
        params.append(owner_id)
    params.append(_limit(limit))
    return db.query("SELECT a.id, a.name, a.industry, a.type, a.employees, a.city, a.state, "
                    "a.owner_id, u.full_name AS owner_name FROM accounts a "
                    "JOIN users u ON u.id = a.owner_id" + _where(cond)
                    + " ORDER BY a.name LIMIT %s", *params)


def get_account(db, account_id: int) -> dict:
    """Get one account with its contacts, opportunities and number of open tasks.

    Args:
        account_id: The account id.
    """
    account = _account(db, account_id)
    account["contacts"] = db.query(
        "SELECT id, first_name, last_name, title, email, phone, is_primary FROM contacts "
        "WHERE account_id = %s ORDER BY is_primary DESC, id", account_id)
    account["opportunities"] = db.query(
        "SELECT o.id, o.name, o.stage, o.amount, o.expected_close_date, o.closed_on, o.owner_id, "
        "u.full_name AS owner_name FROM opportunities o JOIN users u ON u.id = o.owner_id "
        "WHERE o.account_id = %s ORDER BY o.id", account_id)
    account["open_tasks"] = db.scalar(
        "SELECT count(*) FROM tasks WHERE account_id = %s AND status = 'open'", account_id)
    return account


def search_contacts(db, query: str | None = None, account_id: int | None = None,
                    limit: int = 20) -> list:
    """Search contacts (people at accounts) by name, email or title.

    Args:
        query: Part of the first name, last name, full name, email or title (case-insensitive).
        account_id: Only contacts at this account.
        limit: Maximum number of contacts to return (1-100).
    """
    cond, params = [], []
    if query:
        cond.append("(c.first_name || ' ' || c.last_name ILIKE %s OR c.email ILIKE %s "
                    "OR c.title ILIKE %s)")
        params += [f"%{query.strip()}%"] * 3
    if account_id is not None:
        cond.append("c.account_id = %s")
        params.append(account_id)
    params.append(_limit(limit))
    return db.query("SELECT c.id, c.first_name, c.last_name, c.title, c.email, c.phone, "
                    "c.is_primary, c.account_id, a.name AS account_name FROM contacts c "
                    "JOIN accounts a ON a.id = c.account_id" + _where(cond)
                    + " ORDER BY c.last_name, c.first_name, c.id LIMIT %s", *params)


def get_contact(db, contact_id: int) -> dict:
    """Get one contact with their account and their last five activities.

    Args:
        contact_id: The contact id.
    """
    contact = _contact(db, contact_id)
    contact["account_name"] = db.scalar("SELECT name FROM accounts WHERE id = %s",
                                        contact["account_id"])
    contact["recent_activities"] = db.query(
        "SELECT id, type, subject, occurred_at, user_id FROM activities WHERE contact_id = %s "
        "ORDER BY occurred_at DESC, id DESC LIMIT 5", contact_id)
    return contact


def search_leads(db, query: str | None = None,
                 status: Literal["new", "contacted", "qualified", "unqualified", "converted"] | None = None,
                 source: Literal["website", "referral", "trade_show", "webinar", "cold_outreach",
                                 "partner"] | None = None,
                 owner_id: int | None = None, limit: int = 20) -> list:
    """Search leads: prospective buyers who are not (yet) accounts and contacts.

    Args:
        query: Part of the lead's name, company or email (case-insensitive).
        status: Only leads in this status.
        source: Only leads from this source.
        owner_id: Only leads owned by this user (you are user 1).
        limit: Maximum number of leads to return (1-100).
    """
    cond, params = [], []
    if query:
        cond.append("(l.first_name || ' ' || l.last_name ILIKE %s OR l.company ILIKE %s "
                    "OR l.email ILIKE %s)")
        params += [f"%{query.strip()}%"] * 3
    if status:
        cond.append("l.status = %s")
        params.append(status)
    if source:
        cond.append("l.source = %s")
        params.append(source)
    if owner_id is not None:
        cond.append("l.owner_id = %s")
        params.append(owner_id)
    params.append(_limit(limit))
    return db.query("SELECT l.id, l.first_name, l.last_name, l.title, l.company, l.email, "
                    "l.source, l.status, l.owner_id, u.full_name AS owner_name, l.created_at "
                    "FROM leads l JOIN users u ON u.id = l.owner_id" + _where(cond)
                    + " ORDER BY l.created_at DESC, l.id LIMIT %s", *params)


def get_lead(db, lead_id: int) -> dict:
    """Get one lead with its conversion details and activities.

    Args:
        lead_id: The lead id.
    """
    lead = _lead(db, lead_id)
    lead["activities"] = db.query(
        "SELECT id, type, subject, occurred_at, user_id FROM activities WHERE lead_id = %s "
        "ORDER BY occurred_at DESC, id DESC", lead_id)
    return lead


def search_opportunities(db, query: str | None = None,
                         stage: Literal["prospecting", "qualification", "proposal", "negotiation",
                                        "closed_won", "closed_lost"] | None = None,
                         owner_id: int | None = None, team_id: int | None = None,
                         account_id: int | None = None, open_only: bool = False,
                         expected_close_from: str | None = None,
                         expected_close_to: str | None = None,
                         closed_from: str | None = None, closed_to: str | None = None,
                         min_amount: float | None = None, limit: int = 20) -> list:
    """Search opportunities (deals) with filters. Results are sorted by expected close date.

    Args:
        query: Part of the opportunity name or account name (case-insensitive).
        stage: Only opportunities in this pipeline stage.
        owner_id: Only opportunities owned by this user (you are user 1).
        team_id: Only opportunities owned by members of this team.
        account_id: Only opportunities of this account.
        open_only: Only opportunities that are not closed (won or lost).
        expected_close_from: Expected close date on or after this date (YYYY-MM-DD).
        expected_close_to: Expected close date on or before this date (YYYY-MM-DD).
        closed_from: Actually closed (won or lost) on or after this date (YYYY-MM-DD).
        closed_to: Actually closed (won or lost) on or before this date (YYYY-MM-DD).
        min_amount: Only opportunities worth at least this amount (USD).
        limit: Maximum number of opportunities to return (1-100).
    """
    cond, params = [], []
    if query:
        cond.append("(o.name ILIKE %s OR a.name ILIKE %s)")
        params += [f"%{query.strip()}%"] * 2
    if stage:
        cond.append("o.stage = %s")
        params.append(stage)
    if owner_id is not None:
        cond.append("o.owner_id = %s")
        params.append(owner_id)
    if team_id is not None:
        cond.append("u.team_id = %s")
        params.append(team_id)
    if account_id is not None:
        cond.append("o.account_id = %s")
        params.append(account_id)
    if open_only:
        cond.append("o.stage NOT IN ('closed_won', 'closed_lost')")
    for value, column, op, label in ((expected_close_from, "o.expected_close_date", ">=", "expected_close_from"),
                                     (expected_close_to, "o.expected_close_date", "<=", "expected_close_to"),
                                     (closed_from, "o.closed_on", ">=", "closed_from"),
                                     (closed_to, "o.closed_on", "<=", "closed_to")):
        if value:
            cond.append(f"{column} {op} %s::date")
            params.append(_date(value, label))
    if min_amount is not None:
        cond.append("o.amount >= %s")
        params.append(min_amount)
    params.append(_limit(limit))
    return db.query("SELECT o.id, o.name, o.account_id, a.name AS account_name, o.owner_id, "
                    "u.full_name AS owner_name, o.stage, o.amount, o.probability, "
                    "o.expected_close_date, o.closed_on FROM opportunities o "
                    "JOIN accounts a ON a.id = o.account_id JOIN users u ON u.id = o.owner_id"
                    + _where(cond) + " ORDER BY o.expected_close_date, o.id LIMIT %s", *params)


def get_opportunity(db, opportunity_id: int) -> dict:
    """Get one opportunity with its primary contact, stage history, quotes and open tasks.

    Args:
        opportunity_id: The opportunity id.
    """
    opp = _opportunity(db, opportunity_id)
    opp["primary_contact"] = db.one(
        "SELECT id, first_name, last_name, email, title FROM contacts WHERE id = %s",
        opp["primary_contact_id"]) if opp["primary_contact_id"] else None
    opp["stage_history"] = db.query(
        "SELECT from_stage, to_stage, changed_by, changed_at FROM opportunity_stage_history "
        "WHERE opportunity_id = %s ORDER BY changed_at, id", opportunity_id)
    opp["quotes"] = db.query(
        f"SELECT q.id, q.quote_number, q.status, q.valid_until, {_QUOTE_TOTAL} AS total "
        "FROM quotes q LEFT JOIN quote_lines l ON l.quote_id = q.id WHERE q.opportunity_id = %s "
        "GROUP BY q.id ORDER BY q.id", opportunity_id)
    opp["open_tasks"] = db.query(
        "SELECT id, title, due_date, priority, assigned_to FROM tasks "
        "WHERE opportunity_id = %s AND status = 'open' ORDER BY due_date, id", opportunity_id)
    return opp


def pipeline_summary(db, owner_id: int | None = None, team_id: int | None = None) -> dict:
    """Open pipeline by stage: number of deals, total amount and probability-weighted amount.

    Without filters it summarises your own pipeline.

    Args:
        owner_id: Summarise the deals of this user.
        team_id: Summarise the deals of everyone on this team.
    """
    cond, params = ["o.stage NOT IN ('closed_won', 'closed_lost')"], []
    if owner_id is None and team_id is None:
        owner_id = ME
    if owner_id is not None:
        cond.append("o.owner_id = %s")
        params.append(owner_id)
    if team_id is not None:
        cond.append("u.team_id = %s")
        params.append(team_id)
    rows = db.query("SELECT o.stage, count(*) AS deals, sum(o.amount) AS amount, "
                    "round(sum(o.amount * o.probability / 100.0), 2) AS weighted_amount "
                    "FROM opportunities o JOIN users u ON u.id = o.owner_id" + _where(cond)
                    + " GROUP BY o.stage", *params)
    by_stage = {r["stage"]: r for r in rows}
    stages = [by_stage.get(s, {"stage": s, "deals": 0, "amount": 0, "weighted_amount": 0})
              for s in OPEN_STAGES]
    return {"owner_id": owner_id, "team_id": team_id, "stages": stages,
            "total_deals": sum(s["deals"] for s in stages),
            "total_amount": round(sum(s["amount"] for s in stages), 2),
            "total_weighted_amount": round(sum(s["weighted_amount"] for s in stages), 2)}


def list_activities(db, account_id: int | None = None, contact_id: int | None = None,
                    opportunity_id: int | None = None, lead_id: int | None = None,
                    user_id: int | None = None,
                    type: Literal["call", "email", "meeting", "note"] | None = None,
                    occurred_from: str | None = None, occurred_to: str | None = None,
                    limit: int = 20) -> list:
    """List logged activities (calls, emails, meetings, notes), newest first.

    Args:
        account_id: Only activities on this account.
        contact_id: Only activities with this contact.
        opportunity_id: Only activities on this opportunity.
        lead_id: Only activities on this lead.
        user_id: Only activities logged by this user (you are user 1).
        type: Only activities of this type.
        occurred_from: On or after this date (YYYY-MM-DD, UTC).
        occurred_to: On or before this date (YYYY-MM-DD, UTC).
        limit: Maximum number of activities to return (1-100).
    """
    cond, params = [], []
    for value, column in ((account_id, "a.account_id"), (contact_id, "a.contact_id"),
                          (opportunity_id, "a.opportunity_id"), (lead_id, "a.lead_id"),
                          (user_id, "a.user_id"), (type, "a.type")):
        if value is not None:
            cond.append(f"{column} = %s")
            params.append(value)
    if occurred_from:
        cond.append("(a.occurred_at AT TIME ZONE 'UTC')::date >= %s::date")
        params.append(_date(occurred_from, "occurred_from"))
    if occurred_to:
        cond.append("(a.occurred_at AT TIME ZONE 'UTC')::date <= %s::date")
        params.append(_date(occurred_to, "occurred_to"))
    params.append(_limit(limit))
    return db.query("SELECT a.id, a.type, a.subject, a.body, a.user_id, u.full_name AS user_name, "
                    "a.account_id, a.contact_id, a.opportunity_id, a.lead_id, a.duration_minutes, "
                    "a.occurred_at FROM activities a JOIN users u ON u.id = a.user_id"
                    + _where(cond) + " ORDER BY a.occurred_at DESC, a.id DESC LIMIT %s", *params)


def list_tasks(db, assigned_to: int | None = None,
               status: Literal["open", "completed", "cancelled"] | None = None,
               priority: Literal["low", "normal", "high"] | None = None,
               due_from: str | None = None, due_to: str | None = None,
               account_id: int | None = None, opportunity_id: int | None = None,
               lead_id: int | None = None, limit: int = 20) -> list:
    """List to-do tasks, soonest due first.

    Args:
        assigned_to: Only tasks assigned to this user (you are user 1).
        status: Only tasks in this status.
        priority: Only tasks with this priority.
        due_from: Due on or after this date (YYYY-MM-DD).
        due_to: Due on or before this date (YYYY-MM-DD).
        account_id: Only tasks linked to this account.
        opportunity_id: Only tasks linked to this opportunity.
        lead_id: Only tasks linked to this lead.
        limit: Maximum number of tasks to return (1-100).
    """
    cond, params = [], []
    for value, column in ((assigned_to, "t.assigned_to"), (status, "t.status"),
                          (priority, "t.priority"), (account_id, "t.account_id"),
                          (opportunity_id, "t.opportunity_id"), (lead_id, "t.lead_id")):
        if value is not None:
            cond.append(f"{column} = %s")
            params.append(value)
    if due_from:
        cond.append("t.due_date >= %s::date")
        params.append(_date(due_from, "due_from"))
    if due_to:
        cond.append("t.due_date <= %s::date")
        params.append(_date(due_to, "due_to"))
    params.append(_limit(limit))
    return db.query("SELECT t.id, t.title, t.due_date, t.priority, t.status, t.assigned_to, "
                    "u.full_name AS assigned_to_name, t.created_by, t.account_id, t.contact_id, "
                    "t.opportunity_id, t.lead_id, t.completed_at FROM tasks t "
                    "JOIN users u ON u.id = t.assigned_to" + _where(cond)
                    + " ORDER BY t.due_date, t.id LIMIT %s", *params)


def search_products(db, query: str | None = None,
                    family: Literal["subscription", "add_on", "services", "support"] | None = None,
                    include_inactive: bool = False, limit: int = 20) -> list:
    """Search the product catalogue (list prices in USD).

    Args:
        query: Part of the SKU or product name (case-insensitive).
        family: Only products of this family.
        include_inactive: Also list retired products (they cannot be quoted).
        limit: Maximum number of products to return (1-100).
    """
    cond, params = [], []
    if query:
        cond.append("(sku ILIKE %s OR name ILIKE %s)")
        params += [f"%{query.strip()}%"] * 2
    if family:
        cond.append("family = %s")
        params.append(family)
    if not include_inactive:
        cond.append("is_active")
    params.append(_limit(limit))
    return db.query("SELECT id, sku, name, family, billing, unit_price, is_active FROM products"
                    + _where(cond) + " ORDER BY id LIMIT %s", *params)


def search_quotes(db, quote_number: str | None = None, opportunity_id: int | None = None,
                  status: Literal["draft", "sent", "accepted", "rejected"] | None = None,
                  limit: int = 20) -> list:
    """Search quotes by number, opportunity or status, with their totals.

    Args:
        quote_number: The quote number or part of it, e.g. "Q-00006".
        opportunity_id: Only quotes for this opportunity.
        status: Only quotes in this status.
        limit: Maximum number of quotes to return (1-100).
    """
    cond, params = [], []
    if quote_number:
        cond.append("q.quote_number ILIKE %s")
        params.append(f"%{quote_number.strip()}%")
    if opportunity_id is not None:
        cond.append("q.opportunity_id = %s")
        params.append(opportunity_id)
    if status:
        cond.append("q.status = %s")
        params.append(status)
    params.append(_limit(limit))
    return db.query(f"SELECT q.id, q.quote_number, q.opportunity_id, o.name AS opportunity_name, "
                    f"q.status, q.valid_until, {_QUOTE_TOTAL} AS total FROM quotes q "
                    "JOIN opportunities o ON o.id = q.opportunity_id "
                    "LEFT JOIN quote_lines l ON l.quote_id = q.id" + _where(cond)
                    + " GROUP BY q.id, o.name ORDER BY q.id LIMIT %s", *params)


def get_quote(db, quote_id: int) -> dict:
    """Get one quote with its line items, list subtotal, discounts and grand total.

    Args:
        quote_id: The quote id (not the quote number; use search_quotes to find it).
    """
    quote = _quote(db, quote_id)
    quote["lines"] = db.query(
        "SELECT l.id, l.product_id, p.sku, p.name, l.quantity, l.unit_price, l.discount_pct, "
        "ROUND(l.quantity * l.unit_price * (100 - l.discount_pct) / 100, 2) AS line_total "
        "FROM quote_lines l JOIN products p ON p.id = l.product_id WHERE l.quote_id = %s "
        "ORDER BY l.id", quote_id)
    subtotal = round(sum(l["quantity"] * l["unit_price"] for l in quote["lines"]), 2)
    total = _quote_total(db, quote_id)
    quote["list_subtotal"] = subtotal
    quote["discount_total"] = round(subtotal - total, 2)
    quote["total"] = total
    return quote


# ------------------------------------------------------------------------------------------
# Leads
# ------------------------------------------------------------------------------------------

def create_lead(db, first_name: str, last_name: str, company: str, email: str,
                source: Literal["website", "referral", "trade_show", "webinar", "cold_outreach",
                                "partner"],
                title: str | None = None, phone: str | None = None) -> dict:
    """Create a new lead owned by you, in status "new".

    Args:
        first_name: The person's first name.
        last_name: The person's last name.
        company: The company they work for.
        email: Their email address; must not belong to an existing lead or contact.
        source: Where the lead came from.
        title: Their job title.
        phone: Their phone number.
    """
    email = _email(email)
    existing = db.one("SELECT id, status FROM leads WHERE lower(email) = lower(%s)", email)
    if existing:
        raise ToolError(f"A lead with email {email} already exists (lead {existing['id']}, "
                        f"status {existing['status']})")
    contact = db.one("SELECT id, account_id FROM contacts WHERE lower(email) = lower(%s)", email)
    if contact:
        raise ToolError(f"{email} is already contact {contact['id']} at account "
                        f"{contact['account_id']}; log activity on the contact instead")
    return db.one("INSERT INTO leads (first_name, last_name, title, company, email, phone, source, "
                  "status, owner_id, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, 'new', %s, now()) "
                  "RETURNING *", _text(first_name, "first_name"), _text(last_name, "last_name"),
                  title, _text(company, "company"), email, phone, source, ME)


_LEAD_TRANSITIONS = {
    "new": {"contacted", "unqualified"},
    "contacted": {"qualified", "unqualified"},
    "qualified": {"contacted", "unqualified"},
    "unqualified": {"contacted"},
    "converted": set(),
}


def update_lead_status(db, lead_id: int,
                       status: Literal["contacted", "qualified", "unqualified"],
                       reason: str | None = None) -> dict:
    """Move one of your leads to a new status.

    Allowed: new -> contacted or unqualified; contacted -> qualified or unqualified;
    qualified -> contacted or unqualified; unqualified -> contacted (re-open). Converted leads are
    final; use convert_lead to convert a qualified lead.

    Args:
        lead_id: The lead id.
        status: The new status.
        reason: Why the lead is disqualified (required for "unqualified").
    """
    lead = _lead(db, lead_id)
    _require_owner(lead, f"Lead {lead_id}")
    if status not in _LEAD_TRANSITIONS[lead["status"]]:
        allowed = ", ".join(sorted(_LEAD_TRANSITIONS[lead["status"]])) or "none (final)"
        raise ToolError(f"Lead {lead_id} is {lead['status']}; cannot move it to {status}. "
                        f"Allowed next statuses: {allowed}")
    if status == "unqualified":
        reason = _text(reason, "reason (required when disqualifying a lead)")
    else:
        reason = None
    return db.one("UPDATE leads SET status = %s, disqualify_reason = %s WHERE id = %s "
                  "RETURNING id, first_name, last_name, company, status, disqualify_reason",
                  status, reason, lead_id)


def convert_lead(db, lead_id: int, account_id: int | None = None,
                 industry: str | None = None, opportunity_name: str | None = None,
                 opportunity_amount: float | None = None,
                 expected_close_date: str | None = None) -> dict:
    """Convert one of your qualified leads into a contact (and account, and optionally an opportunity).

    A new account named after the lead's company is created unless account_id is given; if an
    account with that name already exists, pass its id to attach the contact to it (it must be
    one of your accounts). The new contact becomes the account's primary contact if it has none.
    An opportunity (stage prospecting) is created only when opportunity_name is given.

    Args:
        lead_id: The lead id; the lead must be in status "qualified".
        account_id: Attach the contact to this existing account instead of creating one.
        industry: Industry of the new account (default "Other"); ignored with account_id.
        opportunity_name: Name of the opportunity to create.
        opportunity_amount: Amount in USD of the new opportunity (required with opportunity_name).
        expected_close_date: Expected close date YYYY-MM-DD (required with opportunity_name).
    """
    lead = _lead(db, lead_id)
    _require_owner(lead, f"Lead {lead_id}")
    if lead["status"] != "qualified":
        raise ToolError(f"Lead {lead_id} is {lead['status']}; only qualified leads can be converted")
    if opportunity_name is None and (opportunity_amount is not None or expected_close_date is not None):
        raise ToolError("opportunity_amount and expected_close_date need an opportunity_name")
    if opportunity_name is not None:
        opportunity_name = _text(opportunity_name, "opportunity_name")
        if opportunity_amount is None or expected_close_date is None:
            raise ToolError("creating an opportunity needs opportunity_amount and expected_close_date")
        if opportunity_amount < 0:
            raise ToolError("opportunity_amount must not be negative")
        expected_close_date = _date(expected_close_date, "expected_close_date")
    if db.one("SELECT id FROM contacts WHERE lower(email) = lower(%s)", lead["email"]):
        raise ToolError(f"A contact with email {lead['email']} already exists")
    if account_id is not None:
        account = _account(db, account_id)
        _require_owner(account, f"Account {account_id}")
    else:
        clash = db.one("SELECT id, name FROM accounts WHERE lower(name) = lower(%s)", lead["company"])
        if clash:
            raise ToolError(f"An account named '{clash['name']}' already exists (id {clash['id']}); "
                            f"pass account_id={clash['id']} to attach the lead to it")
        account = db.one("INSERT INTO accounts (name, industry, type, owner_id, created_at) "
                         "VALUES (%s, %s, 'prospect', %s, now()) RETURNING *",
                         lead["company"], (industry or "Other").strip() or "Other", ME)
        account_id = account["id"]
    has_primary = db.one("SELECT id FROM contacts WHERE account_id = %s AND is_primary", account_id)
    contact = db.one("INSERT INTO contacts (account_id, first_name, last_name, title, email, phone, "
                     "is_primary, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, now()) RETURNING id",
                     account_id, lead["first_name"], lead["last_name"], lead["title"], lead["email"],
                     lead["phone"], has_primary is None)
    opportunity_id = None
    if opportunity_name is not None:
        opportunity_id = db.scalar(
            "INSERT INTO opportunities (account_id, name, owner_id, stage, amount, probability, "
            "expected_close_date, primary_contact_id, lead_source, created_at, updated_at) "
            "VALUES (%s, %s, %s, 'prospecting', %s, 10, %s, %s, %s, now(), now()) RETURNING id",
            account_id, opportunity_name, ME, opportunity_amount, expected_close_date,
            contact["id"], lead["source"])
        _record_stage(db, opportunity_id, None, "prospecting")
    db.execute("UPDATE leads SET status = 'converted', converted_account_id = %s, "
               "converted_contact_id = %s, converted_opportunity_id = %s, converted_at = now() "
               "WHERE id = %s", account_id, contact["id"], opportunity_id, lead_id)
    return {"lead_id": lead_id, "status": "converted", "account_id": account_id,
            "contact_id": contact["id"], "opportunity_id": opportunity_id}


# ------------------------------------------------------------------------------------------
# Accounts and contacts
# ------------------------------------------------------------------------------------------

def create_account(db, name: str, industry: str, city: str | None = None,
                   state: str | None = None, country: str = "US", website: str | None = None,
                   phone: str | None = None, employees: int | None = None) -> dict:
    """Create a new prospect account owned by you. Account names are unique (case-insensitive).

    Args:
        name: Company name.
        industry: Industry, e.g. "Healthcare".
        city: City of the headquarters.
        state: State or region code.
        country: Country code.
        website: Company website URL.
        phone: Main phone number.
        employees: Number of employees.
    """
    name = _text(name, "name")
    clash = db.one("SELECT id FROM accounts WHERE lower(name) = lower(%s)", name)
    if clash:
        raise ToolError(f"An account named '{name}' already exists (id {clash['id']})")
    if employees is not None and employees < 0:
        raise ToolError("employees must not be negative")
    return db.one("INSERT INTO accounts (name, industry, type, employees, website, phone, city, "
                  "state, country, owner_id, created_at) VALUES (%s, %s, 'prospect', %s, %s, %s, "
                  "%s, %s, %s, %s, now()) RETURNING *", name, _text(industry, "industry"),
                  employees, website, phone, city, state, _text(country, "country"), ME)


def update_account(db, account_id: int, industry: str | None = None,
                   type: Literal["prospect", "customer", "partner", "churned"] | None = None,
                   website: str | None = None, phone: str | None = None,
                   employees: int | None = None, city: str | None = None,
                   state: str | None = None) -> dict:
    """Update fields of one of your accounts. Only the given fields change.

    Args:
        account_id: The account id.
        industry: New industry.
        type: New account type.
        website: New website URL.
        phone: New main phone number.
        employees: New number of employees.
        city: New city.
        state: New state or region code.
    """
    account = _account(db, account_id)
    _require_owner(account, f"Account {account_id}")
    changes = {k: v for k, v in (("industry", industry), ("type", type), ("website", website),
                                 ("phone", phone), ("employees", employees), ("city", city),
                                 ("state", state)) if v is not None}
    if not changes:
        raise ToolError("nothing to update: give at least one field")
    if employees is not None and employees < 0:
        raise ToolError("employees must not be negative")
    sets = ", ".join(f"{k} = %s" for k in changes)
    return db.one(f"UPDATE accounts SET {sets} WHERE id = %s RETURNING *",
                  *changes.values(), account_id)


def create_contact(db, account_id: int, first_name: str, last_name: str, email: str,
                   title: str | None = None, phone: str | None = None,
                   is_primary: bool = False) -> dict:
    """Add a contact (a person) to an account. Emails are unique across all contacts.

    With is_primary the new contact replaces the account's current primary contact; the first
    contact of an account always becomes primary.

    Args:
        account_id: The account the person works at.
        first_name: First name.
        last_name: Last name.
        email: Email address.
        title: Job title.
        phone: Phone number.
        is_primary: Make this the account's primary contact.
    """
    _account(db, account_id)
    email = _email(email)
    clash = db.one("SELECT id, account_id FROM contacts WHERE lower(email) = lower(%s)", email)
    if clash:
        raise ToolError(f"Contact {clash['id']} (account {clash['account_id']}) already uses {email}")
    has_primary = db.one("SELECT id FROM contacts WHERE account_id = %s AND is_primary", account_id)
    if is_primary and has_primary:
        db.execute("UPDATE contacts SET is_primary = FALSE WHERE account_id = %s AND is_primary",
                   account_id)
    return db.one("INSERT INTO contacts (account_id, first_name, last_name, title, email, phone, "
                  "is_primary, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, now()) RETURNING *",
                  account_id, _text(first_name, "first_name"), _text(last_name, "last_name"),
                  title, email, phone, bool(is_primary or has_primary is None))


def update_contact(db, contact_id: int, title: str | None = None, email: str | None = None,
                   phone: str | None = None, make_primary: bool = False) -> dict:
    """Update a contact's title, email or phone, or make them their account's primary contact.

    Args:
        contact_id: The contact id.
        title: New job title.
        email: New email address (must be unique).
        phone: New phone number.
        make_primary: Make this contact the primary contact of their account.
    """
    contact = _contact(db, contact_id)
    changes = {}
    if title is not None:
        changes["title"] = title
    if phone is not None:
        changes["phone"] = phone
    if email is not None:
        email = _email(email)
        clash = db.one("SELECT id FROM contacts WHERE lower(email) = lower(%s) AND id <> %s",
                       email, contact_id)
        if clash:
            raise ToolError(f"Contact {clash['id']} already uses {email}")
        changes["email"] = email
    if make_primary and not contact["is_primary"]:
        db.execute("UPDATE contacts SET is_primary = FALSE WHERE account_id = %s AND is_primary",
                   contact["account_id"])
        changes["is_primary"] = True
    if not changes:
        raise ToolError("nothing to update: give at least one field to change")
    sets = ", ".join(f"{k} = %s" for k in changes)
    return db.one(f"UPDATE contacts SET {sets} WHERE id = %s RETURNING *", *changes.values(),
                  contact_id)


# ------------------------------------------------------------------------------------------
# Opportunities
# ------------------------------------------------------------------------------------------

def create_opportunity(db, account_id: int, name: str, amount: float, expected_close_date: str,
                       primary_contact_id: int | None = None) -> dict:
    """Open a new opportunity (stage prospecting) on one of your accounts.

    Args:
        account_id: The account id; you must own the account.
        name: Opportunity name, unique within the account.
        amount: Estimated amount in USD.
        expected_close_date: Expected close date YYYY-MM-DD.
        primary_contact_id: A contact at the same account (defaults to the account's primary contact).
    """
    account = _account(db, account_id)
    _require_owner(account, f"Account {account_id}")
    name = _text(name, "name")
    if amount < 0:
        raise ToolError("amount must not be negative")
    close = _date(expected_close_date, "expected_close_date")
    if db.one("SELECT id FROM opportunities WHERE account_id = %s AND lower(name) = lower(%s)",
              account_id, name):
        raise ToolError(f"Account {account_id} already has an opportunity named '{name}'")
    if primary_contact_id is not None:
        if _contact(db, primary_contact_id)["account_id"] != account_id:
            raise ToolError(f"Contact {primary_contact_id} does not work at account {account_id}")
    else:
        primary_contact_id = db.scalar("SELECT id FROM contacts WHERE account_id = %s AND is_primary",
                                       account_id)
    opp = db.one("INSERT INTO opportunities (account_id, name, owner_id, stage, amount, probability, "
                 "expected_close_date, primary_contact_id, lead_source, created_at, updated_at) "
                 "VALUES (%s, %s, %s, 'prospecting', %s, 10, %s, %s, 'outbound', now(), now()) "
                 "RETURNING *", account_id, name, ME, amount, close, primary_contact_id)
    _record_stage(db, opp["id"], None, "prospecting")
    return opp


def update_opportunity(db, opportunity_id: int, name: str | None = None,
                       amount: float | None = None, expected_close_date: str | None = None,
                       primary_contact_id: int | None = None) -> dict:
    """Update the name, amount, expected close date or primary contact of one of your open opportunities.

    Use move_opportunity_stage to change the stage.

    Args:
        opportunity_id: The opportunity id.
        name: New name.
        amount: New amount in USD.
        expected_close_date: New expected close date YYYY-MM-DD.
        primary_contact_id: New primary contact (must work at the opportunity's account).
    """
    opp = _opportunity(db, opportunity_id)
    _require_owner(opp, f"Opportunity {opportunity_id}")
    _require_open(opp)
    changes = {}
    if name is not None:
        changes["name"] = _text(name, "name")
    if amount is not None:
        if amount < 0:
            raise ToolError("amount must not be negative")
        changes["amount"] = amount
    if expected_close_date is not None:
        changes["expected_close_date"] = _date(expected_close_date, "expected_close_date")
    if primary_contact_id is not None:
        if _contact(db, primary_contact_id)["account_id"] != opp["account_id"]:
            raise ToolError(f"Contact {primary_contact_id} does not work at account {opp['account_id']}")
        changes["primary_contact_id"] = primary_contact_id
    if not changes:
        raise ToolError("nothing to update: give at least one field to change")
    sets = ", ".join(f"{k} = %s" for k in changes)
    return db.one(f"UPDATE opportunities SET {sets}, updated_at = now() WHERE id = %s RETURNING *",
                  *changes.values(), opportunity_id)


def move_opportunity_stage(db, opportunity_id: int,
                           stage: Literal["prospecting", "qualification", "proposal", "negotiation",
                                          "closed_won", "closed_lost"],
                           loss_reason: str | None = None) -> dict:
    """Move one of your opportunities to another pipeline stage.

    Pipeline: prospecting -> qualification -> proposal -> negotiation -> closed_won. Forward moves
    go one stage at a time; moving back to an earlier open stage is allowed; closed_won only from
    negotiation; closed_lost from any open stage and needs a loss_reason. Closed deals are final.
    The probability is set from the stage (10/20/50/75/100/0%).

    Args:
        opportunity_id: The opportunity id.
        stage: The target stage.
        loss_reason: Why the deal was lost (required for closed_lost).
    """
    opp = _opportunity(db, opportunity_id)
    _require_owner(opp, f"Opportunity {opportunity_id}")
    _require_open(opp)
    current = opp["stage"]
    if stage == current:
        raise ToolError(f"Opportunity {opportunity_id} is already in {stage}")
    reason = None
    if stage == "closed_lost":
        reason = _text(loss_reason, "loss_reason (required when closing a deal as lost)")
    elif stage == "closed_won":
        if current != "negotiation":
            raise ToolError(f"Opportunity {opportunity_id} is in {current}; deals can only be won "
                            "from negotiation")
        if opp["amount"] <= 0:
            raise ToolError("cannot win a deal with amount 0; set the amount first")
    elif OPEN_STAGES.index(stage) > OPEN_STAGES.index(current) + 1:
        nxt = OPEN_STAGES[OPEN_STAGES.index(current) + 1]
        raise ToolError(f"cannot skip stages: opportunity {opportunity_id} is in {current}, "
                        f"move it to {nxt} first")
    closed = stage in ("closed_won", "closed_lost")
    db.execute("UPDATE opportunities SET stage = %s, probability = %s, loss_reason = %s, "
               "closed_on = CASE WHEN %s THEN CURRENT_DATE ELSE NULL END, updated_at = now() "
               "WHERE id = %s", stage, STAGE_PROBABILITY[stage], reason, closed, opportunity_id)
    _record_stage(db, opportunity_id, current, stage)
    result = _opportunity(db, opportunity_id)
    return {k: result[k] for k in ("id", "name", "stage", "probability", "amount",
                                   "expected_close_date", "loss_reason", "closed_on")}


def reassign_opportunity(db, opportunity_id: int, new_owner_id: int) -> dict:
    """Hand one of your open opportunities over to an active rep on your own team.

    Args:
        opportunity_id: The opportunity id.
        new_owner_id: User id of the new owner.
    """
    opp = _opportunity(db, opportunity_id)
    _require_owner(opp, f"Opportunity {opportunity_id}")
    _require_open(opp)
    if new_owner_id == ME:
        raise ToolError("you already own this opportunity")
    user = _user(db, new_owner_id)
    me = _user(db, ME)
    if not user["is_active"]:
        raise ToolError(f"{user['full_name']} (user {new_owner_id}) is no longer active")
    if user["role"] != "rep" or user["team_id"] != me["team_id"]:
        raise ToolError(f"{user['full_name']} is not a sales rep on your team; opportunities can "
                        "only be handed to reps on your own team")
    db.execute("UPDATE opportunities SET owner_id = %s, updated_at = now() WHERE id = %s",
               new_owner_id, opportunity_id)
    return {"id": opportunity_id, "name": opp["name"], "previous_owner_id": ME,
            "owner_id": new_owner_id, "owner_name": user["full_name"]}


# ------------------------------------------------------------------------------------------
# Activities and tasks
# ------------------------------------------------------------------------------------------

def log_activity(db, type: Literal["call", "email", "meeting", "note"], subject: str,
                 body: str | None = None, account_id: int | None = None,
                 contact_id: int | None = None, opportunity_id: int | None = None,
                 lead_id: int | None = None, occurred_at: str | None = None,
                 duration_minutes: int | None = None) -> dict:
    """Log a call, email, meeting or note as done by you.

    Link it to a lead, or to account records (account, contact and/or opportunity; the account is
    filled in from the contact or opportunity).

    Args:
        type: Kind of activity.
        subject: Short subject line.
        body: Details or notes.
        account_id: The account it concerns.
        contact_id: The contact it was with.
        opportunity_id: The opportunity it concerns.
        lead_id: The lead it concerns (not combined with account records).
        occurred_at: When it happened, ISO date-time (UTC); default now.
        duration_minutes: Length of a call or meeting in minutes.
    """
    subject = _text(subject, "subject")
    if account_id is None and contact_id is None and opportunity_id is None and lead_id is None:
        raise ToolError("link the activity to a lead, account, contact or opportunity")
    account_id = _check_links(db, account_id, contact_id, opportunity_id, lead_id)
    if duration_minutes is not None:
        if type not in ("call", "meeting"):
            raise ToolError("duration_minutes only applies to calls and meetings")
        if duration_minutes < 0 or duration_minutes > 24 * 60:
            raise ToolError("duration_minutes must be between 0 and 1440")
    when = _datetime(occurred_at, "occurred_at") if occurred_at else None
    return db.one("INSERT INTO activities (type, subject, body, user_id, account_id, contact_id, "
                  "opportunity_id, lead_id, duration_minutes, occurred_at) VALUES (%s, %s, %s, %s, "
                  "%s, %s, %s, %s, %s, COALESCE(%s::timestamptz, now())) RETURNING *",
                  type, subject, body, ME, account_id, contact_id, opportunity_id, lead_id,
                  duration_minutes, when)


def create_task(db, title: str, due_date: str,
                priority: Literal["low", "normal", "high"] = "normal",
                assigned_to: int | None = None, description: str | None = None,
                account_id: int | None = None, contact_id: int | None = None,
                opportunity_id: int | None = None, lead_id: int | None = None) -> dict:
    """Create a to-do task for yourself or a colleague.

    Args:
        title: What needs to be done.
        due_date: Due date YYYY-MM-DD.
        priority: Task priority.
        assigned_to: User id of the assignee (an active user); default yourself.
        description: Longer description.
        account_id: Related account.
        contact_id: Related contact.
        opportunity_id: Related opportunity (its account is filled in).
        lead_id: Related lead (not combined with account records).
    """
    title = _text(title, "title")
    due = _date(due_date, "due_date")
    assignee = _user(db, ME if assigned_to is None else assigned_to)
    if not assignee["is_active"]:
        raise ToolError(f"{assignee['full_name']} (user {assignee['id']}) is no longer active")
    account_id = _check_links(db, account_id, contact_id, opportunity_id, lead_id)
    return db.one("INSERT INTO tasks (title, description, due_date, priority, status, assigned_to, "
                  "created_by, account_id, contact_id, opportunity_id, lead_id, created_at) VALUES "
                  "(%s, %s, %s, %s, 'open', %s, %s, %s, %s, %s, %s, now()) RETURNING *",
                  title, description, due, priority, assignee["id"], ME, account_id, contact_id,
                  opportunity_id, lead_id)


def _my_open_task(db, task_id):
    task = _task(db, task_id)
    if ME not in (task["assigned_to"], task["created_by"]):
        raise ToolError(f"Task {task_id} is assigned to user {task['assigned_to']}; you can only "
                        "change tasks assigned to or created by you")
    if task["status"] != "open":
        raise ToolError(f"Task {task_id} is already {task['status']}")
    return task


def complete_task(db, task_id: int) -> dict:
    """Mark an open task assigned to (or created by) you as completed.

    Args:
        task_id: The task id.
    """
    _my_open_task(db, task_id)
    return db.one("UPDATE tasks SET status = 'completed', completed_at = now() WHERE id = %s "
                  "RETURNING id, title, status, due_date, completed_at", task_id)


def cancel_task(db, task_id: int) -> dict:
    """Cancel an open task assigned to (or created by) you that no longer needs doing.

    Args:
        task_id: The task id.
    """
    _my_open_task(db, task_id)
    return db.one("UPDATE tasks SET status = 'cancelled' WHERE id = %s "
                  "RETURNING id, title, status, due_date", task_id)


def reschedule_task(db, task_id: int, due_date: str) -> dict:
    """Change the due date of an open task assigned to (or created by) you.

    Args:
        task_id: The task id.
        due_date: New due date YYYY-MM-DD.
    """
    _my_open_task(db, task_id)
    return db.one("UPDATE tasks SET due_date = %s WHERE id = %s RETURNING id, title, status, due_date",
                  _date(due_date, "due_date"), task_id)


# ------------------------------------------------------------------------------------------
# Quotes
# ------------------------------------------------------------------------------------------

def create_quote(db, opportunity_id: int, valid_until: str, notes: str | None = None) -> dict:
    """Create an empty draft quote for one of your open opportunities (not in prospecting).

    The quote number is assigned automatically. Add items with add_quote_line.

    Args:
        opportunity_id: The opportunity id.
        valid_until: Last day the offer is valid, YYYY-MM-DD.
        notes: Notes printed on the quote.
    """
    opp = _opportunity(db, opportunity_id)
    _require_owner(opp, f"Opportunity {opportunity_id}")
    _require_open(opp)
    if opp["stage"] == "prospecting":
        raise ToolError(f"Opportunity {opportunity_id} is still in prospecting; qualify it before quoting")
    accepted = db.one("SELECT quote_number FROM quotes WHERE opportunity_id = %s AND status = 'accepted'",
                      opportunity_id)
    if accepted:
        raise ToolError(f"Quote {accepted['quote_number']} was already accepted for this opportunity")
    valid = _date(valid_until, "valid_until")
    quote_id = db.scalar("SELECT nextval(pg_get_serial_sequence('quotes', 'id'))")
    return db.one("INSERT INTO quotes (id, quote_number, opportunity_id, status, valid_until, notes, "
                  "created_by, created_at) VALUES (%s, %s, %s, 'draft', %s, %s, %s, now()) RETURNING *",
                  quote_id, f"Q-{quote_id:05d}", opportunity_id, valid, notes, ME)


def _my_draft_quote(db, quote_id):
    quote = _quote(db, quote_id)
    _require_owner(quote, f"The opportunity of quote {quote['quote_number']}")
    if quote["status"] != "draft":
        raise ToolError(f"Quote {quote['quote_number']} is {quote['status']}; only draft quotes can "
                        "be edited")
    return quote


def add_quote_line(db, quote_id: int, product_id: int, quantity: int,
                   discount_pct: float = 0) -> dict:
    """Add a product to one of your draft quotes at its list price, with an optional discount.

    Each product can appear once per quote. Reps may discount up to 20%; more needs a manager.

    Args:
        quote_id: The quote id.
        product_id: The product id (see search_products).
        quantity: Number of units (seats, packages, days...), at least 1.
        discount_pct: Discount on this line in percent, 0-20.
    """
    quote = _my_draft_quote(db, quote_id)
    product = db.one("SELECT * FROM products WHERE id = %s", product_id)
    if product is None:
        raise ToolError(f"Product {product_id} not found")
    if not product["is_active"]:
        raise ToolError(f"Product {product['sku']} is retired and cannot be quoted")
    if quantity < 1:
        raise ToolError("quantity must be at least 1")
    if discount_pct < 0:
        raise ToolError("discount_pct must not be negative")
    if discount_pct > MAX_REP_DISCOUNT:
        raise ToolError(f"discounts above {MAX_REP_DISCOUNT}% need manager approval")
    if db.one("SELECT id FROM quote_lines WHERE quote_id = %s AND product_id = %s", quote_id, product_id):
        raise ToolError(f"{product['sku']} is already on quote {quote['quote_number']}; remove that "
                        "line first to change it")
    line = db.one("INSERT INTO quote_lines (quote_id, product_id, quantity, unit_price, discount_pct) "
                  "VALUES (%s, %s, %s, %s, %s) RETURNING *", quote_id, product_id, quantity,
                  product["unit_price"], discount_pct)
    line["sku"] = product["sku"]
    line["quote_total"] = _quote_total(db, quote_id)
    return line


def remove_quote_line(db, quote_line_id: int) -> dict:
    """Remove a line item from one of your draft quotes.

    Args:
        quote_line_id: The id of the quote line (see get_quote).
    """
    line = db.one("SELECT * FROM quote_lines WHERE id = %s", quote_line_id)
    if line is None:
        raise ToolError(f"Quote line {quote_line_id} not found")
    _my_draft_quote(db, line["quote_id"])
    db.execute("DELETE FROM quote_lines WHERE id = %s", quote_line_id)
    return {"removed_line_id": quote_line_id, "quote_id": line["quote_id"],
            "quote_total": _quote_total(db, line["quote_id"])}


def update_quote_status(db, quote_id: int, status: Literal["sent", "accepted", "rejected"]) -> dict:
    """Send one of your draft quotes, or record the customer's decision on a sent quote.

    draft -> sent (needs at least one line); sent -> accepted or rejected. Accepting a quote sets
    the opportunity amount to the quote total and marks the opportunity's other draft or sent
    quotes as rejected; it does not close the opportunity.

    Args:
        quote_id: The quote id.
        status: The new status.
    """
    quote = _quote(db, quote_id)
    _require_owner(quote, f"The opportunity of quote {quote['quote_number']}")
    number = quote["quote_number"]
    if status == "sent":
        if quote["status"] != "draft":
            raise ToolError(f"Quote {number} is {quote['status']}; only draft quotes can be sent")
        if not db.scalar("SELECT count(*) FROM quote_lines WHERE quote_id = %s", quote_id):
            raise ToolError(f"Quote {number} has no lines; add products before sending it")
        db.execute("UPDATE quotes SET status = 'sent', sent_at = now() WHERE id = %s", quote_id)
    else:
        if quote["status"] != "sent":
            raise ToolError(f"Quote {number} is {quote['status']}; only sent quotes can be "
                            f"{status}")
        if status == "accepted":
            if quote["opportunity_stage"] in ("closed_won", "closed_lost"):
                raise ToolError(f"The opportunity is already {quote['opportunity_stage']}")
            db.execute("UPDATE quotes SET status = 'rejected', decided_at = now() "
                       "WHERE opportunity_id = %s AND id <> %s AND status IN ('draft', 'sent')",
                       quote["opportunity_id"], quote_id)
            db.execute("UPDATE opportunities SET amount = %s, updated_at = now() WHERE id = %s",
                       _quote_total(db, quote_id), quote["opportunity_id"])
        db.execute("UPDATE quotes SET status = %s, decided_at = now() WHERE id = %s", status, quote_id)
    result = _quote(db, quote_id)
    return {"id": quote_id, "quote_number": number, "status": result["status"],
            "opportunity_id": quote["opportunity_id"], "total": _quote_total(db, quote_id)}
