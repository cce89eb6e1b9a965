"""Verifiers of the project tracker tasks. `final` is the database after the episode, `initial` the
untouched snapshot; both offer query/one/scalar with %s placeholders."""

import re

ME = 1
OPEN = ("backlog", "todo", "in_progress", "in_review")


def _norm(text):
    return re.sub(r"\s+", " ", str(text or "")).strip().lower()


def _numbers(answer):
    text = str(answer or "").replace(",", "")
    return [float(x) for x in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\d])", text)]


def _has_number(answer, value):
    return any(abs(n - float(value)) < 1e-6 for n in _numbers(answer))


def _has_word(answer, word):
    return re.search(r"(?<![\w-])" + re.escape(word.lower()) + r"(?![\w-])", _norm(answer)) is not None


def _issue(db, key):
    project, number = key.split("-")
    return db.one(
        "SELECT i.* FROM issues i JOIN projects p ON p.id = i.project_id WHERE p.key = %s AND i.number = %s",
        project, int(number),
    )


def _labels(db, issue_id):
    rows = db.query(
        "SELECT l.name FROM issue_labels il JOIN labels l ON l.id = il.label_id WHERE il.issue_id = %s",
        issue_id,
    )
    return {r["name"] for r in rows}


def verify_create_checkout_bug(final, initial, answer):
    title = "checkout button unresponsive on safari 17"
    old_ids = {r["id"] for r in initial.query("SELECT id FROM issues")}
    rows = [
        r for r in final.query("SELECT * FROM issues WHERE project_id = 1")
        if _norm(r["title"]) == title and r["id"] not in old_ids
    ]
    if len(rows) != 1:
        return False, f"expected exactly one new WEB issue titled {title!r}, found {len(rows)}"
    issue = rows[0]
    expected = {"type": "bug", "priority": "high", "estimate_points": 3, "assignee_id": 4, "sprint_id": 2,
                "reporter_id": ME, "status": "todo"}
    for field, value in expected.items():
        if issue[field] != value:
            return False, f"new issue has {field}={issue[field]!r}, expected {value!r}"
    labels = _labels(final, issue["id"])
    if labels != {"checkout"}:
        return False, f"new issue has labels {sorted(labels)}, expected only 'checkout'"
    return True, "bug created in WEB Sprint 14, assigned to Lena Ortiz with label checkout"


def verify_start_work_web_7(final, initial, answer):
    before = _issue(initial, "WEB-7")
    after = _issue(final, "WEB-7")
    if after["assignee_id"] != ME:
        return False, f"WEB-7 is assigned to {after['assignee_id']}, expected you (1)"
    if after["status"] != "in_progress":
        return False, f"WEB-7 is {after['status']}, expected in_progress"
    if after["sprint_id"] != before["sprint_id"]:
        return False, "WEB-7 was moved to another sprint"
    return True, "WEB-7 assigned to you and in progress"


def verify_finish_api_11(final, initial, answer):
    issue = _issue(final, "API-11")
    if issue["status"] != "done" or not issue["resolved_at"]:
        return False, f"API-11 is {issue['status']}, expected done"
    old = {r["id"] for r in initial.query("SELECT id FROM time_logs WHERE issue_id = %s", issue["id"])}
    new = [r for r in final.query("SELECT * FROM time_logs WHERE issue_id = %s", issue["id"]) if r["id"] not in old]
    if len(new) != 1:
        return False, f"expected exactly one new time log on API-11, found {len(new)}"
    log = new[0]
    if log["user_id"] != ME or log["minutes"] != 90 or log["work_date"] != "2026-03-16":
        return False, f"time log is {log['minutes']} min by user {log['user_id']} on {log['work_date']}, expected 90 min by you on 2026-03-16"
    if "final review fixes" not in _norm(log["note"]):
        return False, f"time log note is {log['note']!r}"
    return True, "API-11 done and 90 minutes logged"


def verify_escalate_security_bugs(final, initial, answer):
    targets = initial.query(
        """SELECT i.id FROM issues i JOIN projects p ON p.id = i.project_id
           WHERE p.key = 'API' AND i.type = 'bug' AND i.status IN ('backlog','todo','in_progress','in_review')
             AND EXISTS (SELECT 1 FROM issue_labels il JOIN labels l ON l.id = il.label_id
                         WHERE il.issue_id = i.id AND l.name = 'security')"""
    )
    target_ids = {r["id"] for r in targets}
    before = {r["id"]: r["priority"] for r in initial.query("SELECT id, priority FROM issues")}
    after = {r["id"]: r["priority"] for r in final.query("SELECT id, priority FROM issues")}
    if not target_ids or all(before[i] == "urgent" for i in target_ids):
        return False, "snapshot has no open API security bug to escalate"
    for issue_id in target_ids:
        if after.get(issue_id) != "urgent":
            return False, f"issue id {issue_id} (open API security bug) has priority {after.get(issue_id)}"
    changed = [i for i in before if i not in target_ids and after.get(i) != before[i]]
    if changed:
        return False, f"priorities of other issues changed: ids {changed}"
    return True, "all open API security bugs are urgent, nothing else changed"


def verify_schedule_checkout_review(final, initial, answer):
    old = {r["id"] for r in initial.query("SELECT id FROM events")}
    events = [
        e for e in final.query("SELECT * FROM events WHERE status = 'scheduled'")
        if e["id"] not in old and _norm(e["title"]) == "checkout redesign review"
    ]
    if len(events) != 1:
        return False, f"expected one new 'Checkout redesign review' event, found {len(events)}"
    event = events[0]
    if event["starts_at"] != "2026-03-18T14:00:00" or event["ends_at"] != "2026-03-18T15:00:00":
        return False, f"meeting is {event['starts_at']} - {event['ends_at']}, expected 2026-03-18 14:00-15:00 (first common free hour)"
    if event["organizer_id"] != ME:
        return False, "you are not the organizer"
    people = {r["user_id"] for r in final.query("SELECT user_id FROM event_attendees WHERE event_id = %s", event["id"])}
    if people != {1, 2, 3}:
        return False, f"attendees are {sorted(people)}, expected you, Priya Nair (2) and Tom Becker (3)"
    if "room ada" not in _norm(event["location"]):
        return False, f"location is {event['location']!r}, expected Room Ada"
    return True, "review scheduled 14:00-15:00 with Priya and Tom in Room Ada"


def verify_complete_mob_sprint(final, initial, answer):
    sprint = final.one("SELECT * FROM sprints WHERE id = 8")
    if sprint["state"] != "closed":
        return False, f"MOB Sprint 9 is {sprint['state']}, expected closed"
    nxt = final.one("SELECT * FROM sprints WHERE id = 9")
    if nxt["state"] != "planned":
        return False, f"MOB Sprint 10 is {nxt['state']}; it should stay planned"
    before = initial.query("SELECT id, status FROM issues WHERE sprint_id = 8")
    after = {r["id"]: r for r in final.query("SELECT id, status, sprint_id FROM issues")}
    for r in before:
        row = after[r["id"]]
        if r["status"] in OPEN and row["sprint_id"] != 9:
            return False, f"unfinished issue id {r['id']} is in sprint {row['sprint_id']}, expected MOB Sprint 10"
        if r["status"] not in OPEN and row["sprint_id"] != 8:
            return False, f"finished issue id {r['id']} left MOB Sprint 9"
        if row["status"] != r["status"]:
            return False, f"issue id {r['id']} changed status"
    return True, "MOB Sprint 9 closed, unfinished issues carried over to MOB Sprint 10"


def verify_comment_and_watch_api_16(final, initial, answer):
    issue = _issue(final, "API-16")
    old = {r["id"] for r in initial.query("SELECT id FROM comments WHERE issue_id = %s", issue["id"])}
    new = [r for r in final.query("SELECT * FROM comments WHERE issue_id = %s", issue["id"]) if r["id"] not in old]
    wanted = "seeing the same timeout with 8k rows when the csv has 40 columns"
    if not any(r["author_id"] == ME and _norm(r["body"]).strip("\"'“” ").rstrip(".") == wanted for r in new):
        return False, "the requested comment by you is missing on API-16"
    if not final.scalar("SELECT count(*) FROM issue_watchers WHERE issue_id = %s AND user_id = %s", issue["id"], ME):
        return False, "you do not watch API-16"
    return True, "comment added and API-16 watched"


def verify_reassign_tom_todos(final, initial, answer):
    moved = initial.query(
        "SELECT id FROM issues WHERE project_id = 1 AND assignee_id = 3 AND status = 'todo' AND sprint_id = 2"
    )
    moved_ids = {r["id"] for r in moved}
    if not moved_ids:
        return False, "no issues to reassign"
    before = {r["id"]: r for r in initial.query("SELECT id, assignee_id, status FROM issues")}
    after = {r["id"]: r for r in final.query("SELECT id, assignee_id, status FROM issues")}
    for i in moved_ids:
        if after[i]["assignee_id"] != 4:
            return False, f"issue id {i} is assigned to {after[i]['assignee_id']}, expected Lena Ortiz (4)"
    for i, row in before.items():
        if i not in moved_ids and after[i]["assignee_id"] != row["assignee_id"]:
            return False, f"issue id {i} should not have been reassigned"
        if after[i]["status"] != row["status"]:
            return False, f"issue id {i} changed status"
    return True, "Tom's To Do issues in WEB Sprint 14 now belong to Lena"


def _my_response(db, title):
    return db.scalar(
        """SELECT a.response FROM events e JOIN event_attendees a ON a.event_id = e.id
           WHERE e.title = %s AND a.user_id = %s""",
        title, ME,
    )


def verify_answer_invitations(final, initial, answer):
    demo = _my_response(final, "Vendor demo: feature flag platform")
    walk = _my_response(final, "Revenue dashboard walkthrough")
    if demo != "declined":
        return False, f"your response to the vendor demo is {demo}, expected declined"
    if walk != "accepted":
        return False, f"your response to the revenue dashboard walkthrough is {walk}, expected accepted"
    return True, "vendor demo declined, walkthrough accepted"


def verify_plan_api_21(final, initial, answer):
    issue = _issue(final, "API-21")
    if issue["sprint_id"] != 5:
        return False, f"API-21 is in sprint {issue['sprint_id']}, expected API Sprint 22 (5)"
    if issue["assignee_id"] != 15:
        return False, f"API-21 is assigned to {issue['assignee_id']}, expected Oliver Grant (15)"
    if issue["due_date"] != "2026-03-20":
        return False, f"API-21 due date is {issue['due_date']}, expected 2026-03-20"
    if issue["status"] not in OPEN or issue["status"] == "backlog":
        return False, f"API-21 has status {issue['status']}"
    return True, "API-21 planned into the active sprint for Oliver, due 2026-03-20"


def verify_label_needs_design(final, initial, answer):
    label = final.one("SELECT * FROM labels WHERE project_id = 1 AND name = 'needs-design'")
    if label is None:
        return False, "label needs-design does not exist in WEB"
    if label["color"].lower() != "#ec4899":
        return False, f"label color is {label['color']}, expected #ec4899"
    tagged = {
        r["id"] for r in final.query("SELECT issue_id AS id FROM issue_labels WHERE label_id = %s", label["id"])
    }
    expected = {_issue(final, "WEB-21")["id"], _issue(final, "WEB-24")["id"]}
    if tagged != expected:
        return False, f"needs-design is on issue ids {sorted(tagged)}, expected WEB-21 and WEB-24 only"
    return True, "needs-design created and added to WEB-21 and WEB-24"


def verify_web_sprint_13_hours(final, initial, answer):
    if not answer:
        return False, "no answer"
    minutes = initial.scalar(
        """SELECT COALESCE(sum(t.minutes), 0) FROM time_logs t JOIN issues i ON i.id = t.issue_id
           JOIN sprints s ON s.id = i.sprint_id WHERE s.name = 'WEB Sprint 13'"""
    )
    hours = minutes / 60
    if not _has_number(answer, hours):
        return False, f"answer does not state {hours:g} hours"
    return True, f"{hours:g} hours"


def verify_mob_sprint_top_assignee(final, initial, answer):
    if not answer:
        return False, "no answer"
    rows = initial.query(
        """SELECT u.full_name, sum(COALESCE(i.estimate_points, 0)) AS pts FROM issues i
           JOIN users u ON u.id = i.assignee_id JOIN sprints s ON s.id = i.sprint_id
           JOIN projects p ON p.id = s.project_id
           WHERE p.key = 'MOB' AND s.state = 'active' AND i.status IN ('backlog','todo','in_progress','in_review')
           GROUP BY u.full_name ORDER BY pts DESC"""
    )
    top = rows[0]
    if len(rows) > 1 and rows[1]["pts"] == top["pts"]:
        return False, "ambiguous data"
    if top["full_name"].split()[0].lower() not in _norm(answer):
        return False, f"answer does not name {top['full_name']}"
    if not _has_number(answer, top["pts"]):
        return False, f"answer does not state {top['pts']} points"
    return True, f"{top['full_name']} with {top['pts']} points"


def verify_first_meeting_wednesday(final, initial, answer):
    if not answer:
        return False, "no answer"
    row = initial.one(
        """SELECT e.title, e.starts_at, u.full_name FROM events e
           JOIN event_attendees a ON a.event_id = e.id JOIN users u ON u.id = e.organizer_id
           WHERE a.user_id = %s AND a.response <> 'declined' AND e.status = 'scheduled'
             AND e.kind <> 'standup' AND e.starts_at >= '2026-03-18' AND e.starts_at < '2026-03-19'
           ORDER BY e.starts_at LIMIT 1""",
        ME,
    )
    text = _norm(answer)
    if _norm(row["title"]) not in text:
        return False, f"answer does not name {row['title']!r}"
    hh = row["starts_at"][11:13]
    mm = row["starts_at"][14:16]
    hour = int(hh)
    time_forms = [f"{hh}:{mm}", f"{hour}:{mm}"] + ([f"{hour - 12}pm", f"{hour - 12} pm", f"{hour - 12}:{mm} pm", f"{hour - 12}:{mm}pm"] if hour > 12 else [])
    if not any(f in text for f in time_forms):
        return False, f"answer does not give the start time {hh}:{mm}"
    if row["full_name"].split()[0].lower() not in text:
        return False, f"answer does not name the organizer {row['full_name']}"
    return True, f"{row['title']} at {hh}:{mm} by {row['full_name']}"


def verify_unassigned_open_bugs(final, initial, answer):
    if not answer:
        return False, "no answer"
    rows = initial.query(
        """SELECT p.key || '-' || i.number AS key FROM issues i JOIN projects p ON p.id = i.project_id
           WHERE i.type = 'bug' AND i.assignee_id IS NULL AND i.status IN ('backlog','todo','in_progress','in_review')"""
    )
    keys = [r["key"] for r in rows]
    if not _has_number(answer, len(keys)):
        return False, f"answer does not state the count {len(keys)}"
    missing = [k for k in keys if not _has_word(answer, k)]
    if missing:
        return False, f"answer misses {', '.join(missing)}"
    return True, f"{len(keys)} bugs: {', '.join(keys)}"


def verify_mob_top_label_open(final, initial, answer):
    if not answer:
        return False, "no answer"
    rows = initial.query(
        """SELECT l.name, count(i.id) AS n FROM labels l JOIN issue_labels il ON il.label_id = l.id
           JOIN issues i ON i.id = il.issue_id JOIN projects p ON p.id = l.project_id
           WHERE p.key = 'MOB' AND i.status IN ('backlog','todo','in_progress','in_review')
           GROUP BY l.name ORDER BY n DESC"""
    )
    top = rows[0]
    if len(rows) > 1 and rows[1]["n"] == top["n"]:
        return False, "ambiguous data"
    if not _has_word(answer, top["name"]):
        return False, f"answer does not name the label {top['name']!r}"
    if not _has_number(answer, top["n"]):
        return False, f"answer does not state {top['n']} issues"
    return True, f"{top['name']} on {top['n']} open issues"


def verify_api_sprint_remaining_points(final, initial, answer):
    if not answer:
        return False, "no answer"
    pts = initial.scalar(
        """SELECT COALESCE(sum(i.estimate_points), 0) FROM issues i JOIN sprints s ON s.id = i.sprint_id
           WHERE s.name = 'API Sprint 22' AND i.status IN ('backlog','todo','in_progress','in_review')"""
    )
    if not _has_number(answer, pts):
        return False, f"answer does not state {pts} points"
    return True, f"{pts} points left"
