"""Tools of the team project tracker. The acting user is Maya Chen (user id 1)."""

import datetime as _dt
import re
from typing import Literal

ME = 1

STATUSES = ("backlog", "todo", "in_progress", "in_review", "done", "cancelled")
OPEN_STATUSES = ("backlog", "todo", "in_progress", "in_review")
WORKFLOW = {
    "backlog": ("todo", "cancelled"),
    "todo": ("backlog", "in_progress", "cancelled"),
    "in_progress": ("todo", "in_review", "cancelled"),
    "in_review": ("in_progress", "done", "cancelled"),
    "done": ("in_progress",),
    "cancelled": ("backlog",),
}
PRIORITY_RANK = {"urgent": 0, "high": 1, "medium": 2, "low": 3, "none": 4}
POINT_VALUES = (0, 1, 2, 3, 5, 8, 13, 21)
EDIT_ROLES = ("lead", "developer")
MAX_MINUTES_PER_DAY = 720
WORKDAY_START = _dt.time(7, 0)
WORKDAY_END = _dt.time(20, 0)

_ISSUE_SELECT = """
    SELECT i.*, p.key AS project_key, p.status AS project_status, p.workspace_id,
           p.key || '-' || i.number AS key,
           a.full_name AS assignee_name, r.full_name AS reporter_name, s.name AS sprint_name,
           ARRAY(SELECT l.name FROM issue_labels il JOIN labels l ON l.id = il.label_id
                 WHERE il.issue_id = i.id ORDER BY l.name) AS labels
    FROM issues i
    JOIN projects p ON p.id = i.project_id
    LEFT JOIN users a ON a.id = i.assignee_id
    JOIN users r ON r.id = i.reporter_id
    LEFT JOIN sprints s ON s.id = i.sprint_id
"""


def _summary(row):
    return {
        "key": row["key"],
        "id": row["id"],
        "title": row["title"],
        "type": row["type"],
        "status": row["status"],
        "priority": row["priority"],
        "assignee_id": row["assignee_id"],
        "assignee_name": row["assignee_name"],
        "sprint_id": row["sprint_id"],
        "sprint_name": row["sprint_name"],
        "estimate_points": row["estimate_points"],
        "due_date": row["due_date"],
        "labels": row["labels"],
        "created_at": row["created_at"],
    }


def _parse_key(issue_key):
    m = re.fullmatch(r"\s*([A-Za-z][A-Za-z0-9]{1,9})-(\d+)\s*", issue_key or "")
    if not m:
        raise ToolError(f"Invalid issue key {issue_key!r}: expected the form PROJECT-NUMBER, e.g. WEB-12.")
    return m.group(1).upper(), int(m.group(2))


def _issue(db, issue_key):
    project_key, number = _parse_key(issue_key)
    row = db.one(_ISSUE_SELECT + " WHERE p.key = %s AND i.number = %s", project_key, number)
    if row is None:
        raise ToolError(f"Issue {project_key}-{number} not found.")
    return row


def _project(db, project_key):
    key = (project_key or "").strip().upper()
    row = db.one("SELECT * FROM projects WHERE key = %s", key)
    if row is None:
        keys = [r["key"] for r in db.query("SELECT key FROM projects ORDER BY key")]
        raise ToolError(f"Project {key!r} not found. Known project keys: {', '.join(keys)}.")
    return row


def _role(db, project_id, user_id):
    return db.scalar("SELECT role FROM project_members WHERE project_id = %s AND user_id = %s", project_id, user_id)


def _require_writable(db, project_id, action, roles=EDIT_ROLES):
    project = db.one("SELECT * FROM projects WHERE id = %s", project_id)
    if project["status"] == "archived":
        raise ToolError(f"Project {project['key']} is archived; {action} is not possible.")
    role = _role(db, project_id, ME)
    if role not in roles:
        have = f"your role is {role}" if role else "you are not a member of it"
        raise ToolError(
            f"You cannot {action} in project {project['key']}: {have}; required role: {' or '.join(roles)}."
        )
    return project


def _parse_date(value, field):
    try:
        return _dt.date.fromisoformat(str(value).strip())
    except ValueError:
        raise ToolError(f"{field} must be a date in the form YYYY-MM-DD, got {value!r}.")


def _parse_datetime(value, field):
    text = str(value).strip().replace("Z", "+00:00")
    try:
        parsed = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise ToolError(f"{field} must be an ISO date-time like 2026-03-18T14:00, got {value!r}.")
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return parsed


def _touch(db, issue_id):
    db.execute("UPDATE issues SET updated_at = now() WHERE id = %s", issue_id)


def _user(db, user_id):
    row = db.one("SELECT id, full_name, email, job_title, timezone, is_active FROM users WHERE id = %s", user_id)
    if row is None:
        raise ToolError(f"User {user_id} not found.")
    return row


def _busy(db, user_ids, start, end, exclude_event_id=None):
    """Events (not cancelled, not declined) of the given users overlapping [start, end)."""
    return db.query(
        """
        SELECT e.id AS event_id, e.title, e.kind, e.starts_at, e.ends_at, ea.user_id, u.full_name
        FROM events e
        JOIN event_attendees ea ON ea.event_id = e.id
        JOIN users u ON u.id = ea.user_id
        WHERE e.status = 'scheduled' AND ea.response <> 'declined'
          AND ea.user_id = ANY(%s) AND e.starts_at < %s AND e.ends_at > %s AND e.id <> %s
        ORDER BY e.starts_at, ea.user_id
        """,
        list(user_ids), end, start, exclude_event_id or 0,
    )


def get_my_profile(db) -> dict:
    """Show who you are (the acting user), your workspaces and your role in every project.

    Use this first to learn your user id and which projects you may edit (roles lead and
    developer may change issues; reporters may create issues and comment; viewers may only
    comment and watch).
    """
    me = _user(db, ME)
    me["workspaces"] = db.query(
        """SELECT w.id, w.name, w.slug, wm.role FROM workspace_members wm
           JOIN workspaces w ON w.id = wm.workspace_id WHERE wm.user_id = %s ORDER BY w.id""",
        ME,
    )
    me["projects"] = db.query(
        """SELECT p.key, p.name, p.status, pm.role FROM project_members pm
           JOIN projects p ON p.id = pm.project_id WHERE pm.user_id = %s ORDER BY p.id""",
        ME,
    )
    return me


def search_users(
    db,
    query: str | None = None,
    project_key: str | None = None,
    workspace_id: int | None = None,
    include_inactive: bool = False,
    limit: int = 20,
) -> list[dict]:
    """Find people by name, email or job title, optionally only members of a project or workspace.

    Args:
        query: Case-insensitive text matched against full name, email and job title.
        project_key: Only members of this project (e.g. "WEB"); their project role is included.
        workspace_id: Only members of this workspace; their workspace role is included.
        include_inactive: Also return deactivated accounts.
        limit: Maximum number of people to return (1-100).
    """
    limit = max(1, min(limit, 100))
    conds, params = [], []
    select_extra, join = "", ""
    if project_key:
        project = _project(db, project_key)
        join += " JOIN project_members pm ON pm.user_id = u.id AND pm.project_id = %s"
        params.append(project["id"])
        select_extra += ", pm.role AS project_role"
    if workspace_id is not None:
        join += " JOIN workspace_members wm ON wm.user_id = u.id AND wm.workspace_id = %s"
        params.append(workspace_id)
        select_extra += ", wm.role AS workspace_role"
    if query:
        conds.append("(u.full_name ILIKE %s OR u.email ILIKE %s OR u.job_title ILIKE %s)")
        like = f"%{query.strip()}%"
        params += [like, like, like]
    if not include_inactive:
        conds.append("u.is_active")
    where = (" WHERE " + " AND ".join(conds)) if conds else ""
    return db.query(
        f"SELECT u.id, u.full_name, u.email, u.job_title, u.timezone, u.is_active{select_extra} "
        f"FROM users u{join}{where} ORDER BY u.full_name LIMIT {limit}",
        *params,
    )


def list_projects(db, workspace_id: int | None = None, include_archived: bool = False) -> list[dict]:
    """List projects in the workspaces you belong to, with lead, your role and open issue count.

    Args:
        workspace_id: Only projects of this workspace.
        include_archived: Also list archived projects.
    """
    conds = ["p.workspace_id IN (SELECT workspace_id FROM workspace_members WHERE user_id = %s)"]
    params = [ME]
    if workspace_id is not None:
        conds.append("p.workspace_id = %s")
        params.append(workspace_id)
    if not include_archived:
        conds.append("p.status = 'active'")
    return db.query(
        f"""SELECT p.id, p.key, p.name, p.workspace_id, w.name AS workspace_name, p.status,
                   p.lead_user_id, u.full_name AS lead_name,
                   (SELECT role FROM project_members WHERE project_id = p.id AND user_id = %s) AS my_role,
                   (SELECT count(*) FROM issues i WHERE i.project_id = p.id
                      AND i.status IN ('backlog','todo','in_progress','in_review')) AS open_issues
            FROM projects p JOIN workspaces w ON w.id = p.workspace_id JOIN users u ON u.id = p.lead_user_id
            WHERE {' AND '.join(conds)} ORDER BY p.id""",
        ME, *params,
    )


def get_project(db, project_key: str) -> dict:
    """Get a project's details: members and their roles, labels, sprints and issue counts by status.

    Args:
        project_key: Project key, e.g. "WEB".
    """
    project = _project(db, project_key)
    pid = project["id"]
    project["members"] = db.query(
        """SELECT u.id AS user_id, u.full_name, u.job_title, pm.role, u.is_active
           FROM project_members pm JOIN users u ON u.id = pm.user_id
           WHERE pm.project_id = %s ORDER BY pm.role = 'lead' DESC, u.full_name""",
        pid,
    )
    project["labels"] = [r["name"] for r in db.query("SELECT name FROM labels WHERE project_id = %s ORDER BY name", pid)]
    project["sprints"] = db.query(
        "SELECT id, name, state, start_date, end_date FROM sprints WHERE project_id = %s ORDER BY start_date", pid
    )
    counts = db.query("SELECT status, count(*) AS n FROM issues WHERE project_id = %s GROUP BY status", pid)
    project["issue_counts"] = {s: 0 for s in STATUSES} | {r["status"]: r["n"] for r in counts}
    return project


def list_labels(db, project_key: str) -> list[dict]:
    """List a project's labels with how many issues carry each (all issues and open ones).

    Args:
        project_key: Project key, e.g. "MOB".
    """
    project = _project(db, project_key)
    return db.query(
        """SELECT l.id, l.name, l.color,
                  count(i.id) AS issue_count,
                  count(i.id) FILTER (WHERE i.status IN ('backlog','todo','in_progress','in_review')) AS open_issue_count
           FROM labels l LEFT JOIN issue_labels il ON il.label_id = l.id LEFT JOIN issues i ON i.id = il.issue_id
           WHERE l.project_id = %s GROUP BY l.id ORDER BY l.name""",
        project["id"],
    )


def create_label(db, project_key: str, name: str, color: str = "#6b7280") -> dict:
    """Create a new label in a project (requires role lead or developer).

    Args:
        project_key: Project key, e.g. "API".
        name: Label name: lowercase letters, digits and dashes, e.g. "needs-design".
        color: Hex colour like "#ff8800".
    """
    project = _project(db, project_key)
    _require_writable(db, project["id"], "create labels")
    name = name.strip()
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,39}", name):
        raise ToolError("Label names use lowercase letters, digits and dashes (max 40 chars), e.g. 'needs-design'.")
    color = color.strip().lower()
    if not re.fullmatch(r"#[0-9a-f]{6}", color):
        raise ToolError("color must be a hex colour like '#ff8800'.")
    if db.scalar("SELECT 1 FROM labels WHERE project_id = %s AND name = %s", project["id"], name):
        raise ToolError(f"Label {name!r} already exists in {project['key']}.")
    return db.one(
        "INSERT INTO labels (project_id, name, color) VALUES (%s, %s, %s) RETURNING id, project_id, name, color",
        project["id"], name, color,
    )


def list_sprints(db, project_key: str, state: Literal["planned", "active", "closed"] | None = None) -> list[dict]:
    """List a project's sprints with issue counts and story points (total and done).

    Args:
        project_key: Project key, e.g. "WEB".
        state: Only sprints in this state.
    """
    project = _project(db, project_key)
    conds, params = ["s.project_id = %s"], [project["id"]]
    if state:
        conds.append("s.state = %s")
        params.append(state)
    return db.query(
        f"""SELECT s.id, s.name, s.goal, s.state, s.start_date, s.end_date, s.completed_at,
                   count(i.id) AS issue_count,
                   count(i.id) FILTER (WHERE i.status = 'done') AS done_count,
                   COALESCE(sum(i.estimate_points), 0) AS total_points,
                   COALESCE(sum(i.estimate_points) FILTER (WHERE i.status = 'done'), 0) AS done_points
            FROM sprints s LEFT JOIN issues i ON i.sprint_id = s.id
            WHERE {' AND '.join(conds)} GROUP BY s.id ORDER BY s.start_date""",
        *params,
    )


def get_sprint(db, sprint_id: int) -> dict:
    """Get a sprint with all its issues, points per status and open points per assignee.

    Args:
        sprint_id: Sprint id (see list_sprints).
    """
    sprint = db.one(
        "SELECT s.*, p.key AS project_key FROM sprints s JOIN projects p ON p.id = s.project_id WHERE s.id = %s",
        sprint_id,
    )
    if sprint is None:
        raise ToolError(f"Sprint {sprint_id} not found.")
    issues = db.query(_ISSUE_SELECT + " WHERE i.sprint_id = %s ORDER BY i.number", sprint_id)
    sprint["issues"] = [_summary(r) for r in issues]
    by_status = {}
    open_by_assignee = {}
    for r in issues:
        pts = r["estimate_points"] or 0
        by_status[r["status"]] = by_status.get(r["status"], 0) + pts
        if r["status"] in OPEN_STATUSES:
            who = r["assignee_name"] or "Unassigned"
            open_by_assignee[who] = open_by_assignee.get(who, 0) + pts
    sprint["points_by_status"] = by_status
    sprint["open_points_by_assignee"] = open_by_assignee
    sprint["total_points"] = sum(by_status.values())
    return sprint


def start_sprint(db, sprint_id: int) -> dict:
    """Start a planned sprint (requires role lead or developer). A project can have only one
    active sprint and an empty sprint cannot be started.

    Args:
        sprint_id: Id of the planned sprint.
    """
    sprint = db.one("SELECT * FROM sprints WHERE id = %s", sprint_id)
    if sprint is None:
        raise ToolError(f"Sprint {sprint_id} not found.")
    _require_writable(db, sprint["project_id"], "start sprints")
    if sprint["state"] != "planned":
        raise ToolError(f"Sprint {sprint['name']} is {sprint['state']}; only planned sprints can be started.")
    active = db.one("SELECT id, name FROM sprints WHERE project_id = %s AND state = 'active'", sprint["project_id"])
    if active:
        raise ToolError(f"Sprint {active['name']} (id {active['id']}) is still active; complete it first.")
    if not db.scalar("SELECT count(*) FROM issues WHERE sprint_id = %s", sprint_id):
        raise ToolError(f"Sprint {sprint['name']} has no issues; add issues before starting it.")
    db.execute("UPDATE sprints SET state = 'active' WHERE id = %s", sprint_id)
    return get_sprint(db, sprint_id)


def complete_sprint(db, sprint_id: int, move_open_issues_to_sprint_id: int | None = None) -> dict:
    """Complete the active sprint. Unfinished issues (not done or cancelled) are moved to the
    given planned sprint of the same project, or to the backlog (no sprint) when none is given.

    Args:
        sprint_id: Id of the active sprint to complete.
        move_open_issues_to_sprint_id: A planned sprint of the same project that receives unfinished issues.
    """
    sprint = db.one("SELECT * FROM sprints WHERE id = %s", sprint_id)
    if sprint is None:
        raise ToolError(f"Sprint {sprint_id} not found.")
    _require_writable(db, sprint["project_id"], "complete sprints")
    if sprint["state"] != "active":
        raise ToolError(f"Sprint {sprint['name']} is {sprint['state']}; only the active sprint can be completed.")
    target = None
    if move_open_issues_to_sprint_id is not None:
        target = db.one("SELECT * FROM sprints WHERE id = %s", move_open_issues_to_sprint_id)
        if target is None:
            raise ToolError(f"Sprint {move_open_issues_to_sprint_id} not found.")
        if target["project_id"] != sprint["project_id"]:
            raise ToolError("Unfinished issues can only move to a sprint of the same project.")
        if target["state"] != "planned":
            raise ToolError(f"Sprint {target['name']} is {target['state']}; unfinished issues can only move to a planned sprint.")
    open_keys = [
        r["key"] for r in db.query(
            _ISSUE_SELECT + " WHERE i.sprint_id = %s AND i.status IN ('backlog','todo','in_progress','in_review') ORDER BY i.number",
            sprint_id,
        )
    ]
    done = db.scalar("SELECT count(*) FROM issues WHERE sprint_id = %s AND status = 'done'", sprint_id)
    db.execute(
        """UPDATE issues SET sprint_id = %s, updated_at = now()
           WHERE sprint_id = %s AND status IN ('backlog','todo','in_progress','in_review')""",
        target["id"] if target else None, sprint_id,
    )
    db.execute("UPDATE sprints SET state = 'closed', completed_at = now() WHERE id = %s", sprint_id)
    return {
        "sprint_id": sprint_id,
        "name": sprint["name"],
        "state": "closed",
        "completed_issues": done,
        "moved_issues": open_keys,
        "moved_to": target["name"] if target else "backlog",
    }


def search_issues(
    db,
    project_key: str | None = None,
    text: str | None = None,
    status: Literal["backlog", "todo", "in_progress", "in_review", "done", "cancelled"] | None = None,
    open_only: bool = False,
    priority: Literal["urgent", "high", "medium", "low", "none"] | None = None,
    type: Literal["bug", "task", "story", "epic"] | None = None,
    assignee_id: int | None = None,
    unassigned: bool = False,
    reporter_id: int | None = None,
    label: str | None = None,
    sprint_id: int | None = None,
    no_sprint: bool = False,
    watched_by_me: bool = False,
    sort: Literal["created_desc", "created_asc", "priority", "updated_desc", "due_date"] = "created_desc",
    limit: int = 25,
) -> dict:
    """Search issues with filters; returns the total number of matches and up to `limit` issues.

    Args:
        project_key: Only issues of this project, e.g. "API".
        text: Case-insensitive text searched in title and description.
        status: Only issues in this status.
        open_only: Only open issues (backlog, todo, in_progress, in_review).
        priority: Only issues with this priority.
        type: Only issues of this type.
        assignee_id: Only issues assigned to this user id.
        unassigned: Only issues without an assignee.
        reporter_id: Only issues reported by this user id.
        label: Only issues carrying this label name.
        sprint_id: Only issues in this sprint.
        no_sprint: Only issues that are in no sprint (the backlog).
        watched_by_me: Only issues you watch.
        sort: Order: newest first (created_desc), oldest first (created_asc), priority (urgent first,
            then oldest), recently updated first (updated_desc) or due date (earliest first, none last).
        limit: Maximum number of issues to return (1-100).
    """
    limit = max(1, min(limit, 100))
    conds, params = [], []
    if project_key:
        conds.append("p.id = %s")
        params.append(_project(db, project_key)["id"])
    if text:
        conds.append("(i.title ILIKE %s OR i.description ILIKE %s)")
        params += [f"%{text.strip()}%"] * 2
    if status:
        conds.append("i.status = %s")
        params.append(status)
    if open_only:
        conds.append("i.status IN ('backlog','todo','in_progress','in_review')")
    if priority:
        conds.append("i.priority = %s")
        params.append(priority)
    if type:
        conds.append("i.type = %s")
        params.append(type)
    if assignee_id is not None:
        conds.append("i.assignee_id = %s")
        params.append(assignee_id)
    if unassigned:
        conds.append("i.assignee_id IS NULL")
    if reporter_id is not None:
        conds.append("i.reporter_id = %s")
        params.append(reporter_id)
    if label:
        conds.append("EXISTS (SELECT 1 FROM issue_labels il JOIN labels l ON l.id = il.label_id "
                     "WHERE il.issue_id = i.id AND l.name = %s)")
        params.append(label.strip().lower())
    if sprint_id is not None:
        conds.append("i.sprint_id = %s")
        params.append(sprint_id)
    if no_sprint:
        conds.append("i.sprint_id IS NULL")
    if watched_by_me:
        conds.append("EXISTS (SELECT 1 FROM issue_watchers w WHERE w.issue_id = i.id AND w.user_id = %s)")
        params.append(ME)
    where = (" WHERE " + " AND ".join(conds)) if conds else ""
    order = {
        "created_desc": "i.created_at DESC, i.id DESC",
        "created_asc": "i.created_at, i.id",
        "priority": "array_position(ARRAY['urgent','high','medium','low','none'], i.priority), i.created_at",
        "updated_desc": "i.updated_at DESC, i.id DESC",
        "due_date": "i.due_date NULLS LAST, i.id",
    }[sort]
    total = db.scalar(
        "SELECT count(*) FROM issues i JOIN projects p ON p.id = i.project_id" + where, *params
    )
    rows = db.query(_ISSUE_SELECT + where + f" ORDER BY {order} LIMIT {limit}", *params)
    return {"total": total, "returned": len(rows), "issues": [_summary(r) for r in rows]}


def get_issue(db, issue_key: str) -> dict:
    """Get one issue with all fields, labels, watchers, comment count and time logged.

    Args:
        issue_key: Issue key such as "WEB-12".
    """
    row = _issue(db, issue_key)
    row.pop("project_status", None)
    row["watchers"] = db.query(
        """SELECT u.id, u.full_name FROM issue_watchers w JOIN users u ON u.id = w.user_id
           WHERE w.issue_id = %s ORDER BY u.full_name""",
        row["id"],
    )
    row["comment_count"] = db.scalar("SELECT count(*) FROM comments WHERE issue_id = %s", row["id"])
    row["minutes_logged"] = db.scalar("SELECT COALESCE(sum(minutes), 0) FROM time_logs WHERE issue_id = %s", row["id"])
    row["allowed_transitions"] = list(WORKFLOW[row["status"]])
    return row


def create_issue(
    db,
    project_key: str,
    title: str,
    type: Literal["bug", "task", "story", "epic"] = "task",
    priority: Literal["urgent", "high", "medium", "low", "none"] = "medium",
    description: str = "",
    assignee_id: int | None = None,
    sprint_id: int | None = None,
    labels: list[str] | None = None,
    estimate_points: int | None = None,
    due_date: str | None = None,
) -> dict:
    """Create an issue reported by you. It starts in status todo when placed in a sprint, else in
    backlog. You (and the assignee) automatically watch it. Requires role lead, developer or reporter.

    Args:
        project_key: Project key, e.g. "WEB".
        title: Short summary (3-200 characters).
        type: Issue type.
        priority: Priority.
        description: Longer description.
        assignee_id: User id of the assignee; must be an active lead or developer of the project.
        sprint_id: A planned or active sprint of the same project.
        labels: Names of existing project labels to attach.
        estimate_points: Story points, one of 0, 1, 2, 3, 5, 8, 13, 21.
        due_date: Due date YYYY-MM-DD.
    """
    project = _project(db, project_key)
    _require_writable(db, project["id"], "create issues", ("lead", "developer", "reporter"))
    title = title.strip()
    if not 3 <= len(title) <= 200:
        raise ToolError("title must be between 3 and 200 characters.")
    if estimate_points is not None and estimate_points not in POINT_VALUES:
        raise ToolError(f"estimate_points must be one of {', '.join(map(str, POINT_VALUES))}.")
    due = _parse_date(due_date, "due_date").isoformat() if due_date else None
    if assignee_id is not None:
        _check_assignee(db, project, assignee_id)
    if sprint_id is not None:
        _check_sprint(db, project, sprint_id)
    label_ids = []
    for name in labels or []:
        lid = db.scalar("SELECT id FROM labels WHERE project_id = %s AND name = %s", project["id"], name.strip().lower())
        if lid is None:
            known = [r["name"] for r in db.query("SELECT name FROM labels WHERE project_id = %s ORDER BY name", project["id"])]
            raise ToolError(f"Label {name!r} does not exist in {project['key']}. Available: {', '.join(known)}.")
        if lid not in label_ids:
            label_ids.append(lid)
    number = db.scalar("SELECT COALESCE(max(number), 0) + 1 FROM issues WHERE project_id = %s", project["id"])
    issue_id = db.scalar(
        """INSERT INTO issues (project_id, number, title, description, type, status, priority, reporter_id,
                               assignee_id, sprint_id, estimate_points, due_date)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id""",
        project["id"], number, title, description.strip(), type, "todo" if sprint_id else "backlog", priority,
        ME, assignee_id, sprint_id, estimate_points, due,
    )
    for lid in label_ids:
        db.execute("INSERT INTO issue_labels (issue_id, label_id) VALUES (%s, %s)", issue_id, lid)
    for uid in {ME, assignee_id} - {None}:
        db.execute("INSERT INTO issue_watchers (issue_id, user_id) VALUES (%s, %s)", issue_id, uid)
    return _summary(_issue(db, f"{project['key']}-{number}"))


def _check_assignee(db, project, user_id):
    user = _user(db, user_id)
    if not user["is_active"]:
        raise ToolError(f"{user['full_name']} is deactivated and cannot be assigned.")
    role = _role(db, project["id"], user_id)
    if role not in EDIT_ROLES:
        raise ToolError(
            f"{user['full_name']} cannot be assigned in {project['key']}: "
            f"{'their role is ' + role if role else 'not a project member'}; assignees must be a lead or developer."
        )
    return user


def _check_sprint(db, project, sprint_id):
    sprint = db.one("SELECT * FROM sprints WHERE id = %s", sprint_id)
    if sprint is None:
        raise ToolError(f"Sprint {sprint_id} not found.")
    if sprint["project_id"] != project["id"]:
        raise ToolError(f"Sprint {sprint['name']} belongs to another project.")
    if sprint["state"] == "closed":
        raise ToolError(f"Sprint {sprint['name']} is closed; issues can only go into planned or active sprints.")
    return sprint


def update_issue(
    db,
    issue_key: str,
    title: str | None = None,
    description: str | None = None,
    priority: Literal["urgent", "high", "medium", "low", "none"] | None = None,
    type: Literal["bug", "task", "story", "epic"] | None = None,
    estimate_points: int | None = None,
    due_date: str | None = None,
    clear_due_date: bool = False,
) -> dict:
    """Change fields of an open issue (requires role lead or developer). Done or cancelled issues
    must be reopened first. Use transition_issue for status, assign_issue for the assignee.

    Args:
        issue_key: Issue key such as "API-9".
        title: New title (3-200 characters).
        description: New description.
        priority: New priority.
        type: New issue type.
        estimate_points: New story points, one of 0, 1, 2, 3, 5, 8, 13, 21.
        due_date: New due date YYYY-MM-DD.
        clear_due_date: Remove the due date.
    """
    issue = _issue(db, issue_key)
    _require_writable(db, issue["project_id"], "edit issues")
    if issue["status"] not in OPEN_STATUSES:
        raise ToolError(f"{issue['key']} is {issue['status']}; reopen it before editing.")
    sets, params = [], []
    if title is not None:
        title = title.strip()
        if not 3 <= len(title) <= 200:
            raise ToolError("title must be between 3 and 200 characters.")
        sets.append("title = %s")
        params.append(title)
    if description is not None:
        sets.append("description = %s")
        params.append(description.strip())
    if priority is not None:
        sets.append("priority = %s")
        params.append(priority)
    if type is not None:
        sets.append("type = %s")
        params.append(type)
    if estimate_points is not None:
        if estimate_points not in POINT_VALUES:
            raise ToolError(f"estimate_points must be one of {', '.join(map(str, POINT_VALUES))}.")
        sets.append("estimate_points = %s")
        params.append(estimate_points)
    if due_date is not None and clear_due_date:
        raise ToolError("Give either due_date or clear_due_date, not both.")
    if due_date is not None:
        sets.append("due_date = %s")
        params.append(_parse_date(due_date, "due_date").isoformat())
    if clear_due_date:
        sets.append("due_date = NULL")
    if not sets:
        raise ToolError("Nothing to update: pass at least one field.")
    db.execute(f"UPDATE issues SET {', '.join(sets)}, updated_at = now() WHERE id = %s", *params, issue["id"])
    return _summary(_issue(db, issue["key"]))


def transition_issue(
    db,
    issue_key: str,
    to_status: Literal["backlog", "todo", "in_progress", "in_review", "done", "cancelled"],
    comment: str | None = None,
) -> dict:
    """Move an issue along the workflow (requires role lead or developer).

    Workflow: backlog -> todo | cancelled; todo -> backlog | in_progress | cancelled;
    in_progress -> todo | in_review | cancelled; in_review -> in_progress | done | cancelled;
    done -> in_progress (reopen); cancelled -> backlog. in_progress and in_review need an assignee,
    and work cannot start on an issue that sits in a sprint which has not started yet.

    Args:
        issue_key: Issue key such as "WEB-7".
        to_status: The target status.
        comment: Optional comment to add (e.g. the reason for cancelling).
    """
    issue = _issue(db, issue_key)
    _require_writable(db, issue["project_id"], "change issue status")
    current = issue["status"]
    if to_status == current:
        raise ToolError(f"{issue['key']} is already {current}.")
    if to_status not in WORKFLOW[current]:
        raise ToolError(
            f"Cannot move {issue['key']} from {current} to {to_status}. "
            f"Allowed next statuses: {', '.join(WORKFLOW[current])}."
        )
    if to_status in ("in_progress", "in_review") and issue["assignee_id"] is None:
        raise ToolError(f"{issue['key']} has no assignee; assign it before moving it to {to_status}.")
    if to_status == "in_progress" and issue["sprint_id"] is not None:
        state = db.scalar("SELECT state FROM sprints WHERE id = %s", issue["sprint_id"])
        if state == "planned":
            raise ToolError(
                f"{issue['key']} is in {issue['sprint_name']}, which has not started; move it to the active sprint first."
            )
    if comment is not None and not comment.strip():
        raise ToolError("comment must not be empty when given.")
    resolved = "now()" if to_status in ("done", "cancelled") else "NULL"
    db.execute(
        f"UPDATE issues SET status = %s, resolved_at = {resolved}, updated_at = now() WHERE id = %s",
        to_status, issue["id"],
    )
    if comment:
        db.execute("INSERT INTO comments (issue_id, author_id, body) VALUES (%s, %s, %s)", issue["id"], ME, comment.strip())
    result = _summary(_issue(db, issue["key"]))
    result["previous_status"] = current
    return result


def assign_issue(db, issue_key: str, assignee_id: int | None) -> dict:
    """Assign an open issue to a project lead or developer, or unassign it with assignee_id null.
    Issues in progress or in review cannot be left without an assignee. Requires role lead or developer.

    Args:
        issue_key: Issue key such as "WEB-7".
        assignee_id: User id of the new assignee, or null to unassign.
    """
    issue = _issue(db, issue_key)
    project = _require_writable(db, issue["project_id"], "assign issues")
    if issue["status"] not in OPEN_STATUSES:
        raise ToolError(f"{issue['key']} is {issue['status']}; closed issues cannot be reassigned.")
    if assignee_id is None:
        if issue["assignee_id"] is None:
            raise ToolError(f"{issue['key']} is already unassigned.")
        if issue["status"] in ("in_progress", "in_review"):
            raise ToolError(f"{issue['key']} is {issue['status']}; move it back to todo before unassigning.")
    else:
        if issue["assignee_id"] == assignee_id:
            raise ToolError(f"{issue['key']} is already assigned to {issue['assignee_name']}.")
        _check_assignee(db, project, assignee_id)
        if not db.scalar("SELECT 1 FROM issue_watchers WHERE issue_id = %s AND user_id = %s", issue["id"], assignee_id):
            db.execute("INSERT INTO issue_watchers (issue_id, user_id) VALUES (%s, %s)", issue["id"], assignee_id)
    db.execute("UPDATE issues SET assignee_id = %s, updated_at = now() WHERE id = %s", assignee_id, issue["id"])
    result = _summary(_issue(db, issue["key"]))
    result["previous_assignee_id"] = issue["assignee_id"]
    return result


def _label(db, issue, label):
    name = label.strip().lower()
    lid = db.scalar("SELECT id FROM labels WHERE project_id = %s AND name = %s", issue["project_id"], name)
    if lid is None:
        known = [r["name"] for r in db.query("SELECT name FROM labels WHERE project_id = %s ORDER BY name", issue["project_id"])]
        raise ToolError(f"Label {name!r} does not exist in {issue['project_key']}. Available: {', '.join(known)}.")
    return lid, name


def add_label_to_issue(db, issue_key: str, label: str) -> dict:
    """Attach an existing project label to an issue (requires role lead or developer).

    Args:
        issue_key: Issue key such as "MOB-5".
        label: Label name, e.g. "crash".
    """
    issue = _issue(db, issue_key)
    _require_writable(db, issue["project_id"], "label issues")
    lid, name = _label(db, issue, label)
    if name in issue["labels"]:
        raise ToolError(f"{issue['key']} already has label {name!r}.")
    db.execute("INSERT INTO issue_labels (issue_id, label_id) VALUES (%s, %s)", issue["id"], lid)
    _touch(db, issue["id"])
    return _summary(_issue(db, issue["key"]))


def remove_label_from_issue(db, issue_key: str, label: str) -> dict:
    """Remove a label from an issue (requires role lead or developer).

    Args:
        issue_key: Issue key such as "MOB-5".
        label: Label name to remove.
    """
    issue = _issue(db, issue_key)
    _require_writable(db, issue["project_id"], "label issues")
    lid, name = _label(db, issue, label)
    if name not in issue["labels"]:
        raise ToolError(f"{issue['key']} does not have label {name!r}.")
    db.execute("DELETE FROM issue_labels WHERE issue_id = %s AND label_id = %s", issue["id"], lid)
    _touch(db, issue["id"])
    return _summary(_issue(db, issue["key"]))


def move_issue_to_sprint(db, issue_key: str, sprint_id: int | None) -> dict:
    """Put an open issue into a planned or active sprint of its project, or back to the backlog
    with sprint_id null. A backlog-status issue entering a sprint becomes todo; a todo issue leaving
    its sprint goes back to backlog; issues in progress or in review cannot leave their sprint.
    Requires role lead or developer.

    Args:
        issue_key: Issue key such as "API-21".
        sprint_id: Target sprint id, or null for the backlog.
    """
    issue = _issue(db, issue_key)
    project = _require_writable(db, issue["project_id"], "plan sprints")
    if issue["status"] not in OPEN_STATUSES:
        raise ToolError(f"{issue['key']} is {issue['status']}; only open issues can be planned.")
    if sprint_id == issue["sprint_id"]:
        raise ToolError(f"{issue['key']} is already {'in ' + issue['sprint_name'] if sprint_id else 'in the backlog'}.")
    status = issue["status"]
    if sprint_id is None:
        if status in ("in_progress", "in_review"):
            raise ToolError(f"{issue['key']} is {status}; work in progress cannot go back to the backlog.")
        if status == "todo":
            status = "backlog"
    else:
        sprint = _check_sprint(db, project, sprint_id)
        if sprint["state"] == "planned" and status in ("in_progress", "in_review"):
            raise ToolError(f"{issue['key']} is {status}; work in progress cannot move to a sprint that has not started.")
        if status == "backlog":
            status = "todo"
    db.execute(
        "UPDATE issues SET sprint_id = %s, status = %s, updated_at = now() WHERE id = %s",
        sprint_id, status, issue["id"],
    )
    return _summary(_issue(db, issue["key"]))


def add_comment(db, issue_key: str, body: str) -> dict:
    """Comment on an issue as yourself. Any project member (any role) may comment; archived
    projects are read-only.

    Args:
        issue_key: Issue key such as "API-5".
        body: Comment text (1-5000 characters).
    """
    issue = _issue(db, issue_key)
    _require_writable(db, issue["project_id"], "comment", ("lead", "developer", "reporter", "viewer"))
    body = body.strip()
    if not 1 <= len(body) <= 5000:
        raise ToolError("Comment body must be 1-5000 characters.")
    row = db.one(
        "INSERT INTO comments (issue_id, author_id, body) VALUES (%s, %s, %s) RETURNING id, issue_id, author_id, body, created_at",
        issue["id"], ME, body,
    )
    row["issue_key"] = issue["key"]
    return row


def list_comments(db, issue_key: str, limit: int = 20) -> list[dict]:
    """List an issue's comments, oldest first.

    Args:
        issue_key: Issue key such as "WEB-2".
        limit: Maximum number of comments (1-100).
    """
    issue = _issue(db, issue_key)
    limit = max(1, min(limit, 100))
    return db.query(
        f"""SELECT c.id, c.author_id, u.full_name AS author_name, c.body, c.created_at
            FROM comments c JOIN users u ON u.id = c.author_id WHERE c.issue_id = %s
            ORDER BY c.created_at, c.id LIMIT {limit}""",
        issue["id"],
    )


def log_time(db, issue_key: str, minutes: int, work_date: str, note: str = "") -> dict:
    """Log time you worked on an issue. Requires role lead or developer; only issues that have
    been started (in_progress, in_review or done) take time; the date cannot be before the issue
    was created; you can log at most 12 hours (720 minutes) per day across all issues.

    Args:
        issue_key: Issue key such as "API-11".
        minutes: Minutes worked (1-720).
        work_date: The day the work happened, YYYY-MM-DD.
        note: Short description of the work.
    """
    issue = _issue(db, issue_key)
    _require_writable(db, issue["project_id"], "log time")
    if not 1 <= minutes <= 720:
        raise ToolError("minutes must be between 1 and 720.")
    if issue["status"] not in ("in_progress", "in_review", "done"):
        raise ToolError(f"{issue['key']} is {issue['status']}; time can only be logged on started issues.")
    day = _parse_date(work_date, "work_date")
    created = _dt.date.fromisoformat(issue["created_at"][:10])
    if day < created:
        raise ToolError(f"work_date {day} is before {issue['key']} was created ({created}).")
    already = db.scalar("SELECT COALESCE(sum(minutes), 0) FROM time_logs WHERE user_id = %s AND work_date = %s", ME, day)
    if already + minutes > MAX_MINUTES_PER_DAY:
        raise ToolError(
            f"You already logged {already} minutes on {day}; adding {minutes} would exceed the "
            f"{MAX_MINUTES_PER_DAY}-minute daily limit."
        )
    row = db.one(
        """INSERT INTO time_logs (issue_id, user_id, minutes, work_date, note) VALUES (%s, %s, %s, %s, %s)
           RETURNING id, issue_id, user_id, minutes, work_date, note""",
        issue["id"], ME, minutes, day, note.strip(),
    )
    _touch(db, issue["id"])
    row["issue_key"] = issue["key"]
    row["issue_minutes_total"] = db.scalar("SELECT sum(minutes) FROM time_logs WHERE issue_id = %s", issue["id"])
    return row


def list_time_logs(
    db,
    issue_key: str | None = None,
    user_id: int | None = None,
    project_key: str | None = None,
    sprint_id: int | None = None,
    date_from: str | None = None,
    date_to: str | None = None,
    limit: int = 50,
) -> dict:
    """List time logs with filters. The totals cover all matching logs, not only the returned ones.

    Args:
        issue_key: Only logs on this issue.
        user_id: Only logs by this user.
        project_key: Only logs on issues of this project.
        sprint_id: Only logs on issues currently in this sprint.
        date_from: Earliest work date (inclusive), YYYY-MM-DD.
        date_to: Latest work date (inclusive), YYYY-MM-DD.
        limit: Maximum number of logs to return (1-200).
    """
    limit = max(1, min(limit, 200))
    conds, params = [], []
    if issue_key:
        conds.append("t.issue_id = %s")
        params.append(_issue(db, issue_key)["id"])
    if user_id is not None:
        conds.append("t.user_id = %s")
        params.append(user_id)
    if project_key:
        conds.append("i.project_id = %s")
        params.append(_project(db, project_key)["id"])
    if sprint_id is not None:
        conds.append("i.sprint_id = %s")
        params.append(sprint_id)
    if date_from:
        conds.append("t.work_date >= %s")
        params.append(_parse_date(date_from, "date_from"))
    if date_to:
        conds.append("t.work_date <= %s")
        params.append(_parse_date(date_to, "date_to"))
    where = (" WHERE " + " AND ".join(conds)) if conds else ""
    base = " FROM time_logs t JOIN issues i ON i.id = t.issue_id JOIN projects p ON p.id = i.project_id JOIN users u ON u.id = t.user_id"
    totals = db.one(f"SELECT count(*) AS n, COALESCE(sum(t.minutes), 0) AS minutes{base}{where}", *params)
    logs = db.query(
        f"""SELECT t.id, p.key || '-' || i.number AS issue_key, t.user_id, u.full_name AS user_name,
                   t.minutes, t.work_date, t.note{base}{where} ORDER BY t.work_date, t.id LIMIT {limit}""",
        *params,
    )
    return {
        "count": totals["n"],
        "total_minutes": totals["minutes"],
        "total_hours": round(totals["minutes"] / 60, 2),
        "logs": logs,
    }


def watch_issue(db, issue_key: str) -> dict:
    """Start watching an issue to get notified about changes (project members only).

    Args:
        issue_key: Issue key such as "API-5".
    """
    issue = _issue(db, issue_key)
    if _role(db, issue["project_id"], ME) is None:
        raise ToolError(f"You are not a member of {issue['project_key']} and cannot watch its issues.")
    if db.scalar("SELECT 1 FROM issue_watchers WHERE issue_id = %s AND user_id = %s", issue["id"], ME):
        raise ToolError(f"You already watch {issue['key']}.")
    db.execute("INSERT INTO issue_watchers (issue_id, user_id) VALUES (%s, %s)", issue["id"], ME)
    return {"issue_key": issue["key"], "watching": True}


def unwatch_issue(db, issue_key: str) -> dict:
    """Stop watching an issue.

    Args:
        issue_key: Issue key such as "API-5".
    """
    issue = _issue(db, issue_key)
    if not db.execute("DELETE FROM issue_watchers WHERE issue_id = %s AND user_id = %s", issue["id"], ME):
        raise ToolError(f"You do not watch {issue['key']}.")
    return {"issue_key": issue["key"], "watching": False}


def list_events(
    db,
    date_from: str,
    date_to: str | None = None,
    attendee_id: int | None = None,
    project_key: str | None = None,
    kind: Literal["meeting", "standup", "planning", "review", "retro", "one_on_one", "time_off"] | None = None,
    include_declined: bool = False,
    include_cancelled: bool = False,
    limit: int = 50,
) -> list[dict]:
    """List team calendar events (times are UTC) between two dates, earliest first.

    Args:
        date_from: First day (inclusive), YYYY-MM-DD.
        date_to: Last day (inclusive), YYYY-MM-DD; defaults to date_from.
        attendee_id: Only events this user attends (organizers attend their own events).
        project_key: Only events linked to this project.
        kind: Only events of this kind.
        include_declined: With attendee_id, also list events that user declined.
        include_cancelled: Also list cancelled events.
        limit: Maximum number of events (1-200).
    """
    start = _parse_date(date_from, "date_from")
    end = _parse_date(date_to, "date_to") if date_to else start
    if end < start:
        raise ToolError("date_to must not be before date_from.")
    limit = max(1, min(limit, 200))
    conds = ["e.starts_at < %s", "e.ends_at > %s"]
    params = [end + _dt.timedelta(days=1), start]
    if attendee_id is not None:
        cond = "EXISTS (SELECT 1 FROM event_attendees x WHERE x.event_id = e.id AND x.user_id = %s"
        cond += ")" if include_declined else " AND x.response <> 'declined')"
        conds.append(cond)
        params.append(attendee_id)
    if project_key:
        conds.append("e.project_id = %s")
        params.append(_project(db, project_key)["id"])
    if kind:
        conds.append("e.kind = %s")
        params.append(kind)
    if not include_cancelled:
        conds.append("e.status = 'scheduled'")
    return db.query(
        f"""SELECT e.id, e.title, e.kind, e.starts_at, e.ends_at, e.location, e.status, e.organizer_id,
                   o.full_name AS organizer_name, p.key AS project_key,
                   (SELECT count(*) FROM event_attendees a WHERE a.event_id = e.id) AS attendee_count,
                   (SELECT response FROM event_attendees a WHERE a.event_id = e.id AND a.user_id = %s) AS my_response
            FROM events e JOIN users o ON o.id = e.organizer_id LEFT JOIN projects p ON p.id = e.project_id
            WHERE {' AND '.join(conds)} ORDER BY e.starts_at, e.id LIMIT {limit}""",
        ME, *params,
    )


def get_event(db, event_id: int) -> dict:
    """Get one calendar event with its attendees and their responses.

    Args:
        event_id: Event id.
    """
    event = db.one(
        """SELECT e.*, o.full_name AS organizer_name, p.key AS project_key FROM events e
           JOIN users o ON o.id = e.organizer_id LEFT JOIN projects p ON p.id = e.project_id WHERE e.id = %s""",
        event_id,
    )
    if event is None:
        raise ToolError(f"Event {event_id} not found.")
    event["attendees"] = db.query(
        """SELECT u.id AS user_id, u.full_name, a.response FROM event_attendees a JOIN users u ON u.id = a.user_id
           WHERE a.event_id = %s ORDER BY u.full_name""",
        event_id,
    )
    return event


def check_availability(
    db,
    user_ids: list[int],
    date: str,
    include_me: bool = True,
    day_start: str = "09:00",
    day_end: str = "18:00",
) -> dict:
    """Show each person's busy times on a day (events they did not decline, times in UTC) and the
    slots within [day_start, day_end) when everyone is free.

    Args:
        user_ids: The people to check.
        date: The day, YYYY-MM-DD.
        include_me: Also check your own calendar.
        day_start: Start of the window, HH:MM (UTC).
        day_end: End of the window, HH:MM (UTC).
    """
    day = _parse_date(date, "date")
    ids = list(dict.fromkeys(([ME] if include_me else []) + list(user_ids)))
    if not ids:
        raise ToolError("Give at least one user id.")
    for uid in ids:
        _user(db, uid)
    try:
        lo = _dt.datetime.combine(day, _dt.time.fromisoformat(day_start))
        hi = _dt.datetime.combine(day, _dt.time.fromisoformat(day_end))
    except ValueError:
        raise ToolError("day_start and day_end must be times like 09:00.")
    if hi <= lo:
        raise ToolError("day_end must be after day_start.")
    day_lo = _dt.datetime.combine(day, _dt.time(0))
    rows = _busy(db, ids, day_lo, day_lo + _dt.timedelta(days=1))
    busy = {uid: [] for uid in ids}
    intervals = []
    for r in rows:
        busy[r["user_id"]].append({"event_id": r["event_id"], "title": r["title"], "starts_at": r["starts_at"], "ends_at": r["ends_at"]})
        intervals.append((_dt.datetime.fromisoformat(r["starts_at"]), _dt.datetime.fromisoformat(r["ends_at"])))
    free, cursor = [], lo
    for s, e in sorted(intervals):
        if e <= cursor:
            continue
        if s > cursor:
            free.append({"starts_at": cursor.isoformat(), "ends_at": min(s, hi).isoformat()})
        cursor = max(cursor, e)
        if cursor >= hi:
            break
    if cursor < hi:
        free.append({"starts_at": cursor.isoformat(), "ends_at": hi.isoformat()})
    free = [f for f in free if f["starts_at"] < f["ends_at"]]
    return {"date": day.isoformat(), "busy": {str(k): v for k, v in busy.items()}, "free_slots_for_everyone": free}


def schedule_meeting(
    db,
    title: str,
    starts_at: str,
    duration_minutes: int,
    attendee_ids: list[int],
    workspace_id: int = 1,
    project_key: str | None = None,
    kind: Literal["meeting", "planning", "review", "retro", "one_on_one"] = "meeting",
    location: str = "",
) -> dict:
    """Schedule a meeting that you organise. Rules: Monday-Friday between 07:00 and 20:00 UTC,
    15-480 minutes in steps of 5, you must be a non-guest member of the workspace and every attendee
    an active member of it; nobody (you included) may be double-booked by an event they have not
    declined. Attendees start with response 'pending'.

    Args:
        title: Meeting title.
        starts_at: Start time in UTC, ISO format like "2026-03-18T14:00".
        duration_minutes: Length in minutes (15-480, multiple of 5).
        attendee_ids: User ids to invite (you are added automatically as organizer).
        workspace_id: Workspace the meeting belongs to (1 = Northwind Labs, 2 = Analytics Guild).
        project_key: Optional project the meeting is about (must be in the workspace).
        kind: Kind of meeting.
        location: Room name or video link.
    """
    title = title.strip()
    if not 1 <= len(title) <= 200:
        raise ToolError("title must be 1-200 characters.")
    my_role = db.scalar("SELECT role FROM workspace_members WHERE workspace_id = %s AND user_id = %s", workspace_id, ME)
    if my_role is None:
        raise ToolError(f"You are not a member of workspace {workspace_id}.")
    if my_role == "guest":
        raise ToolError(f"Guests cannot organise meetings in workspace {workspace_id}.")
    project_id = None
    if project_key:
        project = _project(db, project_key)
        if project["workspace_id"] != workspace_id:
            raise ToolError(f"Project {project['key']} is not in workspace {workspace_id}.")
        project_id = project["id"]
    start = _parse_datetime(starts_at, "starts_at")
    if not 15 <= duration_minutes <= 480 or duration_minutes % 5:
        raise ToolError("duration_minutes must be 15-480 and a multiple of 5.")
    end = start + _dt.timedelta(minutes=duration_minutes)
    if start.weekday() >= 5:
        raise ToolError(f"{start.date()} is a weekend; meetings are scheduled Monday to Friday.")
    if start.time() < WORKDAY_START or end.date() != start.date() or end.time() > WORKDAY_END:
        raise ToolError("Meetings must lie between 07:00 and 20:00 UTC on one day.")
    invited = [u for u in dict.fromkeys(attendee_ids) if u != ME]
    if not invited:
        raise ToolError("Invite at least one attendee besides yourself.")
    for uid in invited:
        user = _user(db, uid)
        if not user["is_active"]:
            raise ToolError(f"{user['full_name']} is deactivated and cannot be invited.")
        if not db.scalar("SELECT 1 FROM workspace_members WHERE workspace_id = %s AND user_id = %s", workspace_id, uid):
            raise ToolError(f"{user['full_name']} (id {uid}) is not a member of workspace {workspace_id}.")
    conflicts = _busy(db, [ME] + invited, start, end)
    if conflicts:
        lines = "; ".join(
            f"{c['full_name']} has '{c['title']}' {c['starts_at'][:16].replace('T', ' ')} - "
            f"{c['ends_at'][:16].replace('T', ' ')}"
            for c in conflicts
        )
        raise ToolError(f"Double booking: {lines}. Pick another time (see check_availability).")
    event = db.one(
        """INSERT INTO events (workspace_id, project_id, title, kind, organizer_id, starts_at, ends_at, location)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING id""",
        workspace_id, project_id, title, kind, ME, start, end, location.strip(),
    )
    db.execute("INSERT INTO event_attendees (event_id, user_id, response) VALUES (%s, %s, 'accepted')", event["id"], ME)
    for uid in invited:
        db.execute("INSERT INTO event_attendees (event_id, user_id, response) VALUES (%s, %s, 'pending')", event["id"], uid)
    return get_event(db, event["id"])


def respond_to_event(db, event_id: int, response: Literal["accepted", "declined", "tentative"]) -> dict:
    """Answer an invitation you received (not for events you organise). Accepting is refused when
    it would double-book you with another event you have not declined.

    Args:
        event_id: Event id.
        response: Your answer.
    """
    event = db.one("SELECT * FROM events WHERE id = %s", event_id)
    if event is None:
        raise ToolError(f"Event {event_id} not found.")
    if event["status"] == "cancelled":
        raise ToolError(f"Event {event_id} ('{event['title']}') is cancelled.")
    if event["organizer_id"] == ME:
        raise ToolError("You organise this event; cancel it instead of responding.")
    current = db.scalar("SELECT response FROM event_attendees WHERE event_id = %s AND user_id = %s", event_id, ME)
    if current is None:
        raise ToolError(f"You are not invited to event {event_id}.")
    if current == response:
        raise ToolError(f"Your response is already {response}.")
    if response == "accepted":
        conflicts = _busy(db, [ME], event["starts_at"], event["ends_at"], exclude_event_id=event_id)
        if conflicts:
            c = conflicts[0]
            raise ToolError(
                f"Accepting would double-book you with '{c['title']}' ({c['starts_at']} - {c['ends_at']}); "
                "decline one of them first."
            )
    db.execute("UPDATE event_attendees SET response = %s WHERE event_id = %s AND user_id = %s", response, event_id, ME)
    return {"event_id": event_id, "title": event["title"], "previous_response": current, "response": response}


def cancel_event(db, event_id: int) -> dict:
    """Cancel an event you organise.

    Args:
        event_id: Event id.
    """
    event = db.one("SELECT * FROM events WHERE id = %s", event_id)
    if event is None:
        raise ToolError(f"Event {event_id} not found.")
    if event["organizer_id"] != ME:
        raise ToolError("Only the organizer can cancel an event; decline it instead.")
    if event["status"] == "cancelled":
        raise ToolError("The event is already cancelled.")
    db.execute("UPDATE events SET status = 'cancelled' WHERE id = %s", event_id)
    return {"event_id": event_id, "title": event["title"], "status": "cancelled"}
