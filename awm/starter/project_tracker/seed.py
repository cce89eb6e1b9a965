"""Deterministic seed for the project tracker: a product company's engineering workspace in
March 2026 ("today" is Monday 2026-03-16). The acting user is Maya Chen (user id 1)."""

from __future__ import annotations

import datetime as dt
import random

TODAY = dt.date(2026, 3, 16)

USERS = [
    (1, "Maya Chen", "Software Engineer", "Europe/Berlin"),
    (2, "Priya Nair", "Product Designer", "Europe/London"),
    (3, "Tom Becker", "Senior Frontend Engineer", "Europe/Berlin"),
    (4, "Lena Ortiz", "Frontend Engineer", "Europe/Madrid"),
    (5, "Daniel Okafor", "Engineering Manager", "Europe/London"),
    (6, "Sofia Rossi", "Backend Engineer", "Europe/Rome"),
    (7, "Marcus Lee", "Backend Engineer", "America/New_York"),
    (8, "Aisha Rahman", "QA Engineer", "Europe/London"),
    (9, "Jonas Weber", "Senior Mobile Engineer", "Europe/Berlin"),
    (10, "Hana Sato", "Mobile Engineer", "Asia/Tokyo"),
    (11, "Carlos Mendes", "DevOps Engineer", "Europe/Lisbon"),
    (12, "Emily Walsh", "Product Manager", "Europe/Dublin"),
    (13, "Noah Kim", "Lead Data Engineer", "America/Chicago"),
    (14, "Fatima Zahra", "Data Analyst", "Africa/Casablanca"),
    (15, "Oliver Grant", "Security Engineer", "Europe/London"),
    (16, "Ines Duarte", "Technical Writer", "Europe/Lisbon"),
    (17, "Ravi Patel", "Staff Engineer", "Asia/Kolkata"),
    (18, "Greta Nilsson", "Contract Designer", "Europe/Stockholm"),
]
INACTIVE = {18}

WORKSPACES = [
    (1, "Northwind Labs", "northwind", "2025-06-02T09:00:00"),
    (2, "Analytics Guild", "analytics-guild", "2025-09-15T09:00:00"),
]

WORKSPACE_MEMBERS = [
    # (workspace_id, user_id, role)
    (1, 5, "owner"), (1, 12, "admin"), (1, 17, "admin"), (1, 1, "member"), (1, 2, "member"),
    (1, 3, "member"), (1, 4, "member"), (1, 6, "member"), (1, 7, "member"), (1, 8, "member"),
    (1, 9, "member"), (1, 10, "member"), (1, 11, "member"), (1, 15, "member"), (1, 16, "member"),
    (1, 18, "guest"),
    (2, 13, "owner"), (2, 14, "admin"), (2, 6, "member"), (2, 7, "member"), (2, 12, "member"),
    (2, 1, "guest"),
]

PROJECTS = [
    # (id, workspace_id, key, name, description, lead, status, created_at)
    (1, 1, "WEB", "Web Platform", "Customer-facing web storefront and checkout.", 3, "active", "2025-06-10T10:00:00"),
    (2, 1, "API", "Core API", "Public and internal REST APIs, auth and billing services.", 17, "active", "2025-06-10T10:30:00"),
    (3, 1, "MOB", "Mobile App", "iOS and Android shopping apps.", 9, "active", "2025-07-01T09:00:00"),
    (4, 1, "INFRA", "Infrastructure Migration", "Move of all workloads to the new Kubernetes platform (finished).", 11, "archived", "2025-08-04T09:00:00"),
    (5, 2, "DATA", "Data Pipeline", "Warehouse ETL, data quality and BI dashboards.", 13, "active", "2025-09-16T09:00:00"),
]

PROJECT_MEMBERS = {
    # project_id: [(user_id, role)]
    1: [(3, "lead"), (1, "developer"), (2, "developer"), (4, "developer"), (8, "developer"),
        (12, "reporter"), (16, "reporter"), (5, "viewer"), (18, "viewer")],
    2: [(17, "lead"), (1, "developer"), (6, "developer"), (7, "developer"), (15, "developer"),
        (8, "developer"), (12, "reporter"), (5, "viewer")],
    3: [(9, "lead"), (10, "developer"), (2, "developer"), (8, "developer"), (1, "developer"),
        (12, "reporter"), (5, "viewer")],
    4: [(11, "lead"), (1, "developer"), (17, "developer"), (7, "developer")],
    5: [(13, "lead"), (14, "developer"), (6, "developer"), (7, "developer"), (12, "reporter"),
        (1, "viewer")],
}

LABELS = {
    # project_id: [(name, color, title keywords)]
    1: [("frontend", "#3b82f6", ["page", "button", "modal", "form", "screen", "dark mode", "footer", "component", "carousel", "placeholder", "skeleton", "badge"]),
        ("accessibility", "#8b5cf6", ["keyboard", "screen reader", "contrast", "focus trap", "wcag"]),
        ("performance", "#f59e0b", ["lazy-load", "bundle size", "loads slowly", "prefetch", "skeleton"]),
        ("checkout", "#10b981", ["checkout", "cart", "promo code", "apple pay", "password reset"]),
        ("tech-debt", "#6b7280", ["upgrade", "remove legacy", "consolidate", "flaky", "migrate"])],
    2: [("security", "#ef4444", ["jwt", "injection", "session tokens", "cors", "tls", "audit log", "rate limiter", "oauth"]),
        ("auth", "#8b5cf6", ["jwt", "session", "oauth", "login", "password"]),
        ("billing", "#10b981", ["payment", "invoice", "refund", "billing", "tax", "usage metrics"]),
        ("performance", "#f59e0b", ["n+1", "cache", "timeout", "slow", "paginate"]),
        ("tech-debt", "#6b7280", ["upgrade", "deprecate", "split", "openapi", "health check"])],
    3: [("ios", "#0ea5e9", ["ios", "biometric", "heic", "haptic"]),
        ("android", "#22c55e", ["android", "back button"]),
        ("crash", "#ef4444", ["crash", "memory leak"]),
        ("onboarding", "#a855f7", ["onboarding", "opt-in", "review prompt"]),
        ("ux", "#f97316", ["redesign", "dark mode", "haptic", "spinner", "icons", "skip button", "pull-to-refresh"])],
    4: [("kubernetes", "#326ce5", ["kubernetes", "cluster", "node pool"]),
        ("terraform", "#7c3aed", ["terraform", "dns", "vpn"])],
    5: [("etl", "#0891b2", ["etl", "backfill", "airflow", "partition", "sync", "late-arriving"]),
        ("dashboards", "#db2777", ["dashboard", "kpi", "cohort"]),
        ("data-quality", "#65a30d", ["quality", "deduplicate", "stale", "row count", "drift"])],
}

ISSUES = {
    1: [
        ("Migrate marketing pages to the new design system", "story"),
        ("Checkout form loses state on browser back", "bug"),
        ("Footer links overlap on small screens", "bug"),
        ("Add skeleton loaders to the dashboard", "task"),
        ("Lazy-load product images below the fold", "task"),
        ("Cart badge count not updating after removal", "bug"),
        ("Keyboard navigation for the date picker", "story"),
        ("Password reset email link expires too early", "bug"),
        ("Upgrade React Router to v7", "task"),
        ("Dark mode contrast fails WCAG AA on buttons", "bug"),
        ("Add promo code field to checkout", "story"),
        ("Reduce main bundle size below 250 KB", "task"),
        ("Screen reader announces wrong label on search", "bug"),
        ("Saved addresses list pagination", "story"),
        ("Flaky end-to-end test for login flow", "bug"),
        ("Remove legacy jQuery carousel", "task"),
        ("Order history page loads slowly for large accounts", "bug"),
        ("Add Apple Pay to checkout", "story"),
        ("Focus trap missing in the cookie consent modal", "bug"),
        ("Consolidate duplicate button components", "task"),
        ("Show delivery estimate on product page", "story"),
        ("404 page missing search box", "task"),
        ("Prefetch checkout route on cart hover", "task"),
        ("Localize currency formatting for EUR", "story"),
        ("Broken image placeholders in the wishlist", "bug"),
    ],
    2: [
        ("Rotate JWT signing keys automatically", "story"),
        ("Rate limiter ignores X-Forwarded-For header", "bug"),
        ("Add idempotency keys to payment endpoints", "story"),
        ("N+1 query in /orders listing", "bug"),
        ("Upgrade PostgreSQL driver to 3.2", "task"),
        ("Webhook retries use fixed backoff", "bug"),
        ("Expose invoice PDFs via signed URLs", "story"),
        ("Audit log missing actor for admin actions", "bug"),
        ("SQL injection risk in legacy report filter", "bug"),
        ("Paginate /customers endpoint with cursors", "story"),
        ("Refund endpoint returns 500 for partial refunds", "bug"),
        ("Add OpenAPI examples for billing endpoints", "task"),
        ("Session tokens not revoked on password change", "bug"),
        ("Cache product catalog responses", "task"),
        ("Split monolith billing module", "epic"),
        ("Timeout on bulk import over 10k rows", "bug"),
        ("Enforce TLS 1.2 minimum on public endpoints", "task"),
        ("Add per-tenant usage metrics", "story"),
        ("Deprecate v1 search endpoint", "task"),
        ("Currency rounding error on tax calculation", "bug"),
        ("CORS allows wildcard origin on admin API", "bug"),
        ("Background job queue dashboard", "story"),
        ("Health check reports healthy when DB is down", "bug"),
        ("Add OAuth scopes for read-only tokens", "story"),
        ("Slow login under load due to bcrypt cost", "bug"),
    ],
    3: [
        ("App crashes when opening push notification on Android 14", "bug"),
        ("Redesign onboarding carousel", "story"),
        ("Biometric login on iOS", "story"),
        ("Offline mode for order history", "story"),
        ("Crash on image upload with HEIC files", "bug"),
        ("Android back button closes checkout unexpectedly", "bug"),
        ("Update app icons for the spring campaign", "task"),
        ("Reduce cold start time below 2 seconds", "task"),
        ("Deep links to product pages fail on iOS", "bug"),
        ("Add haptic feedback to add-to-cart", "task"),
        ("Onboarding skip button hidden on small phones", "bug"),
        ("Migrate analytics SDK to v5", "task"),
        ("Dark mode for settings screen", "story"),
        ("Crash when rotating device on payment screen", "bug"),
        ("Localize onboarding into Spanish and German", "story"),
        ("Push notification opt-in prompt timing", "task"),
        ("Memory leak in product gallery", "bug"),
        ("Support Android 15 predictive back", "task"),
        ("Pull-to-refresh spinner never stops", "bug"),
        ("In-app review prompt after third order", "story"),
    ],
    4: [
        ("Move staging cluster to Kubernetes 1.29", "task"),
        ("Terraform state migration to remote backend", "task"),
        ("Decommission old VPN gateway", "task"),
        ("Set up cluster autoscaler", "story"),
        ("Cut over DNS to new load balancer", "task"),
        ("Node pool upgrade fails on GPU nodes", "bug"),
        ("Document rollback runbook", "task"),
        ("Migrate secrets to Vault", "story"),
    ],
    5: [
        ("Nightly orders ETL misses late-arriving rows", "bug"),
        ("Build revenue dashboard by region", "story"),
        ("Deduplicate customer records in warehouse", "task"),
        ("Add data quality checks for null emails", "task"),
        ("Backfill March marketing attribution", "task"),
        ("Dashboard filters reset on refresh", "bug"),
        ("Migrate ETL jobs to Airflow 2.8", "epic"),
        ("Currency conversion table stale", "bug"),
        ("Churn cohort analysis", "story"),
        ("Row count alert for daily loads", "task"),
        ("Partition events table by month", "task"),
        ("Schema drift breaks product sync", "bug"),
        ("Self-serve dataset catalog", "story"),
        ("Weekly KPI email report", "story"),
        ("Document warehouse naming conventions", "task"),
    ],
}

SPRINTS = [
    # (id, project_id, name, goal, state, start, end)
    (1, 1, "WEB Sprint 13", "Checkout stability", "closed", "2026-02-23", "2026-03-08"),
    (2, 1, "WEB Sprint 14", "Accessibility fixes and faster pages", "active", "2026-03-09", "2026-03-22"),
    (3, 1, "WEB Sprint 15", "Payments: promo codes and Apple Pay", "planned", "2026-03-23", "2026-04-05"),
    (4, 2, "API Sprint 21", "Billing correctness", "closed", "2026-02-23", "2026-03-08"),
    (5, 2, "API Sprint 22", "Security hardening", "active", "2026-03-09", "2026-03-22"),
    (6, 2, "API Sprint 23", "Performance and pagination", "planned", "2026-03-23", "2026-04-05"),
    (7, 3, "MOB Sprint 8", "Crash-free sessions above 99.5%", "closed", "2026-02-23", "2026-03-08"),
    (8, 3, "MOB Sprint 9", "New onboarding", "active", "2026-03-09", "2026-03-22"),
    (9, 3, "MOB Sprint 10", "Offline and localization", "planned", "2026-03-23", "2026-04-05"),
    (10, 4, "INFRA Sprint 4", "Final cut-over", "closed", "2026-01-12", "2026-01-25"),
    (11, 5, "DATA Sprint 5", "Trustworthy revenue numbers", "active", "2026-03-09", "2026-03-22"),
    (12, 5, "DATA Sprint 6", "Airflow migration", "planned", "2026-03-23", "2026-04-05"),
]

# Hand-set facts the tasks rely on: (project_id, number) -> overrides.
OVERRIDES = {
    (1, 7): dict(status="todo", assignee_id=None, sprint_id=2, priority="high", estimate_points=5),
    (1, 19): dict(status="todo", assignee_id=3, sprint_id=2, priority="medium", estimate_points=2),
    (1, 13): dict(status="in_progress", assignee_id=3, sprint_id=2, priority="high", estimate_points=3),
    (1, 10): dict(status="in_review", assignee_id=4, sprint_id=2, priority="high", estimate_points=2),
    (2, 11): dict(status="in_review", assignee_id=1, sprint_id=5, priority="high", estimate_points=3),
    (2, 9): dict(status="in_progress", assignee_id=15, sprint_id=5, priority="urgent", estimate_points=5),
    (2, 13): dict(status="todo", assignee_id=6, sprint_id=5, priority="high", estimate_points=3),
    (2, 21): dict(status="todo", assignee_id=None, sprint_id=None, priority="medium", estimate_points=2),
    (2, 2): dict(status="done", assignee_id=7, sprint_id=4, priority="high", estimate_points=3),
    (3, 1): dict(status="in_progress", assignee_id=10, sprint_id=8, priority="urgent", estimate_points=5),
}

COMMENT_POOL = [
    "Reproduced on staging, looking into it now.",
    "Can we pull this into the current sprint? Support is getting tickets about it.",
    "PR is up for review.",
    "Added screenshots and a HAR file to the description.",
    "Blocked on the upstream change, will pick this up afterwards.",
    "Looks good to me, approved.",
    "QA passed on staging.",
    "Lower impact than we thought, moving the priority down.",
    "I think this overlaps with another ticket, let's keep both open for now.",
    "Design specs are linked in Figma.",
    "Found the root cause: a race between two requests.",
    "Estimate updated after the spike.",
    "Customer success confirmed the fix works for them.",
    "Needs a follow-up for the edge case with empty carts.",
    "Pairing on this tomorrow morning.",
]

TIME_NOTES = [
    "Investigation", "Implementation", "Code review fixes", "Writing tests", "Pairing session",
    "Debugging on staging", "Spike", "Documentation", "",
]

_PRIORITIES = ["urgent", "high", "medium", "low", "none"]
_PRIORITY_WEIGHTS = [8, 25, 40, 20, 7]


def _ts(d: dt.datetime) -> str:
    return d.replace(microsecond=0).isoformat()


def _weekday_between(rng: random.Random, lo: dt.date, hi: dt.date) -> dt.date:
    days = [lo + dt.timedelta(days=i) for i in range((hi - lo).days + 1)]
    weekdays = [d for d in days if d.weekday() < 5] or days
    return rng.choice(weekdays)


def rows() -> list[tuple[str, list[dict]]]:
    rng = random.Random(20260316)
    out: list[tuple[str, list[dict]]] = []

    out.append(("users", [
        {"id": uid, "full_name": name, "email": name.lower().replace(" ", ".") + "@northwind.example",
         "job_title": title, "timezone": tz, "is_active": uid not in INACTIVE}
        for uid, name, title, tz in USERS
    ]))
    out.append(("workspaces", [
        {"id": wid, "name": name, "slug": slug, "created_at": created}
        for wid, name, slug, created in WORKSPACES
    ]))
    wm_rows = []
    for i, (wid, uid, role) in enumerate(WORKSPACE_MEMBERS, start=1):
        joined = dt.datetime(2025, 6, 2, 9) + dt.timedelta(days=3 * i) if wid == 1 else dt.datetime(2025, 9, 15, 9) + dt.timedelta(days=2 * i)
        wm_rows.append({"id": i, "workspace_id": wid, "user_id": uid, "role": role, "joined_at": _ts(joined)})
    out.append(("workspace_members", wm_rows))
    out.append(("projects", [
        {"id": pid, "workspace_id": wid, "key": key, "name": name, "description": desc,
         "lead_user_id": lead, "status": status, "created_at": created}
        for pid, wid, key, name, desc, lead, status, created in PROJECTS
    ]))
    pm_rows = []
    for pid, members in PROJECT_MEMBERS.items():
        for uid, role in members:
            pm_rows.append({"id": len(pm_rows) + 1, "project_id": pid, "user_id": uid, "role": role})
    out.append(("project_members", pm_rows))

    label_rows = []
    label_ids: dict[tuple[int, str], int] = {}
    for pid, labels in LABELS.items():
        for name, color, _ in labels:
            label_rows.append({"id": len(label_rows) + 1, "project_id": pid, "name": name, "color": color})
            label_ids[(pid, name)] = len(label_rows)
    out.append(("labels", label_rows))

    sprint_rows = []
    sprints_by_project: dict[int, dict[str, dict]] = {}
    for sid, pid, name, goal, state, start, end in SPRINTS:
        row = {"id": sid, "project_id": pid, "name": name, "goal": goal, "state": state,
               "start_date": start, "end_date": end,
               "completed_at": f"{end}T17:00:00" if state == "closed" else None}
        sprint_rows.append(row)
        sprints_by_project.setdefault(pid, {})[state] = row
    out.append(("sprints", sprint_rows))

    issue_rows = []
    issue_label_rows = []
    for pid, specs in ISSUES.items():
        members = PROJECT_MEMBERS[pid]
        devs = [u for u, r in members if r in ("lead", "developer") and u not in INACTIVE]
        reporters = [u for u, r in members if r in ("lead", "developer", "reporter") and u not in INACTIVE]
        sp = sprints_by_project[pid]
        n = len(specs)
        start = dt.datetime(2025, 12, 1, 9) if pid == 4 else dt.datetime(2026, 1, 5, 9)
        end = dt.datetime(2026, 1, 20, 9) if pid == 4 else dt.datetime(2026, 3, 13, 9)
        for idx, (title, itype) in enumerate(specs):
            number = idx + 1
            created = start + (end - start) * idx / max(n - 1, 1)
            created = created.replace(hour=9 + rng.randrange(8), minute=rng.choice([0, 10, 20, 30, 40, 50]))
            if created.weekday() >= 5:
                created += dt.timedelta(days=7 - created.weekday())
            frac = idx / n
            if pid == 4:
                bucket = rng.choices(["closed", "backlog"], [85, 15])[0]
            elif frac < 0.4:
                bucket = rng.choices(["closed", "active", "backlog"], [55, 20, 25])[0]
            elif frac < 0.7:
                bucket = rng.choices(["closed", "active", "planned", "backlog"], [15, 50, 10, 25])[0]
            else:
                bucket = rng.choices(["active", "planned", "backlog"], [40, 25, 35])[0]
            if bucket == "closed" and ("closed" not in sp or created.date() > dt.date.fromisoformat(sp["closed"]["end_date"]) - dt.timedelta(days=3)):
                bucket = "active"
            if bucket == "planned" and "planned" not in sp:
                bucket = "backlog"
            if bucket == "closed":
                status = rng.choices(["done", "cancelled"], [90, 10])[0]
            elif bucket == "active":
                status = rng.choices(["todo", "in_progress", "in_review", "done"], [30, 30, 15, 25])[0]
            elif bucket == "planned":
                status = "todo"
            else:
                status = rng.choices(["backlog", "todo", "cancelled"], [75, 17, 8])[0]
            sprint_id = sp[bucket]["id"] if bucket in ("closed", "active", "planned") else None
            if status in ("in_progress", "in_review", "done") or (status == "todo" and rng.random() < 0.7) or (status in ("backlog", "cancelled") and rng.random() < 0.3):
                assignee = rng.choice(devs)
            else:
                assignee = None
            if itype == "epic":
                points = rng.choice([None, 13, 21])
            elif bucket == "backlog" and rng.random() < 0.4:
                points = None
            else:
                points = rng.choice([1, 2, 3, 3, 5, 5, 8])
            priority = rng.choices(_PRIORITIES, _PRIORITY_WEIGHTS)[0]
            ov = OVERRIDES.get((pid, number), {})
            status = ov.get("status", status)
            assignee = ov.get("assignee_id", assignee)
            sprint_id = ov.get("sprint_id", sprint_id)
            priority = ov.get("priority", priority)
            points = ov.get("estimate_points", points)

            resolved = None
            if status in ("done", "cancelled"):
                sprint = next((s for s in sprint_rows if s["id"] == sprint_id), None)
                lo = created + dt.timedelta(hours=4)
                if sprint is not None:
                    lo = max(lo, dt.datetime.fromisoformat(sprint["start_date"] + "T09:00:00"))
                    hi = dt.datetime.fromisoformat(sprint["end_date"] + "T17:00:00")
                    hi = min(hi, dt.datetime(2026, 3, 13, 18))
                else:
                    hi = min(created + dt.timedelta(days=20), dt.datetime(2026, 3, 13, 18))
                if hi <= lo:
                    hi = lo + dt.timedelta(hours=6)
                resolved = lo + (hi - lo) * rng.random()
                resolved = max(resolved.replace(hour=9 + resolved.hour % 9), created + dt.timedelta(hours=1))
            if resolved is not None:
                updated = resolved
            else:
                span = dt.datetime(2026, 3, 13, 18) - created
                updated = created + span * rng.random() * 0.8
                updated = max(updated.replace(hour=9 + updated.hour % 9), created)
            due = None
            if status not in ("done", "cancelled") and rng.random() < 0.3:
                due = TODAY + dt.timedelta(days=rng.randrange(3, 45))
            issue_id = len(issue_rows) + 1
            issue_rows.append({
                "id": issue_id, "project_id": pid, "number": number, "title": title,
                "description": f"{title}. See linked discussion for context and acceptance criteria.",
                "type": itype, "status": status, "priority": priority,
                "reporter_id": rng.choice(reporters), "assignee_id": assignee, "sprint_id": sprint_id,
                "estimate_points": points, "due_date": due.isoformat() if due else None,
                "created_at": _ts(created), "updated_at": _ts(updated),
                "resolved_at": _ts(resolved) if resolved else None,
            })
            low = title.lower()
            for name, _color, words in LABELS[pid]:
                if any(w in low for w in words):
                    issue_label_rows.append({"issue_id": issue_id, "label_id": label_ids[(pid, name)]})
    out.append(("issues", issue_rows))
    out.append(("issue_labels", issue_label_rows))

    members_by_project = {pid: [u for u, _ in m if u not in INACTIVE] for pid, m in PROJECT_MEMBERS.items()}
    comment_rows = []
    time_rows = []
    watcher_rows = []
    minutes_per_day: dict[tuple[int, str], int] = {}
    cutoff = dt.datetime(2026, 3, 13, 18)
    for issue in issue_rows:
        pid = issue["project_id"]
        created = dt.datetime.fromisoformat(issue["created_at"])
        last = dt.datetime.fromisoformat(issue["resolved_at"]) if issue["resolved_at"] else cutoff
        if rng.random() < 0.5:
            for _ in range(rng.randint(1, 2)):
                when = created + (last - created) * rng.random()
                when = when.replace(hour=9 + when.hour % 9)  # people comment during office hours
                when = min(max(when, created + dt.timedelta(minutes=20)), max(last, created + dt.timedelta(minutes=20)))
                comment_rows.append({
                    "id": len(comment_rows) + 1, "issue_id": issue["id"],
                    "author_id": rng.choice(members_by_project[pid]), "body": rng.choice(COMMENT_POOL),
                    "created_at": _ts(when),
                })
        if issue["assignee_id"] and issue["status"] in ("in_progress", "in_review", "done"):
            for _ in range(rng.randint(1, 3)):
                user = issue["assignee_id"]
                if rng.random() < 0.2:
                    user = rng.choice([u for u, r in PROJECT_MEMBERS[pid] if r in ("lead", "developer") and u not in INACTIVE])
                work_date = _weekday_between(rng, created.date(), last.date())
                minutes = rng.choice([30, 45, 60, 90, 120, 180, 240])
                key = (user, work_date.isoformat())
                if minutes_per_day.get(key, 0) + minutes > 480:
                    continue
                minutes_per_day[key] = minutes_per_day.get(key, 0) + minutes
                time_rows.append({
                    "id": len(time_rows) + 1, "issue_id": issue["id"], "user_id": user,
                    "minutes": minutes, "work_date": work_date.isoformat(),
                    "note": rng.choice(TIME_NOTES),
                    "created_at": _ts(dt.datetime.combine(work_date, dt.time(17, 30))),
                })
        watchers = [issue["reporter_id"]]
        if issue["assignee_id"] and issue["assignee_id"] not in watchers:
            watchers.append(issue["assignee_id"])
        if rng.random() < 0.5:
            u = rng.choice(members_by_project[pid])
            if u not in watchers:
                watchers.append(u)
        for u in watchers:
            watcher_rows.append({"issue_id": issue["id"], "user_id": u, "added_at": issue["created_at"]})
    out.append(("comments", comment_rows))
    out.append(("time_logs", time_rows))
    out.append(("issue_watchers", watcher_rows))

    events, attendees = _events()
    out.append(("events", events))
    out.append(("event_attendees", attendees))
    return out


def _events() -> tuple[list[dict], list[dict]]:
    events: list[dict] = []
    attendees: list[dict] = []

    def add(ws, project, title, kind, organizer, day, start, end, people, location="", status="scheduled", responses=None):
        eid = len(events) + 1
        events.append({
            "id": eid, "workspace_id": ws, "project_id": project, "title": title, "kind": kind,
            "organizer_id": organizer, "starts_at": f"{day}T{start}:00", "ends_at": f"{day}T{end}:00"
            if len(end) == 5 else end, "location": location, "status": status,
            "created_at": "2026-03-02T08:00:00",
        })
        responses = responses or {}
        for u in [organizer] + [p for p in people if p != organizer]:
            resp = "accepted" if u == organizer else responses.get(u, "accepted")
            attendees.append({"event_id": eid, "user_id": u, "response": resp})

    web_team = [3, 1, 2, 4, 8]
    # Daily WEB standups for the current week.
    for day in ["2026-03-16", "2026-03-17", "2026-03-18", "2026-03-19", "2026-03-20"]:
        add(1, 1, "WEB daily standup", "standup", 3, day, "09:30", "09:45", web_team, "Zoom")
    # API standups Tue/Thu this week.
    for day in ["2026-03-17", "2026-03-19"]:
        add(1, 2, "API standup", "standup", 17, day, "10:00", "10:15", [17, 1, 6, 7, 15, 8], "Zoom")
    # Previous week.
    add(1, 1, "WEB Sprint 14 planning", "planning", 3, "2026-03-09", "10:00", "11:30", web_team + [12], "Room Ada")
    add(1, 2, "API Sprint 22 planning", "planning", 17, "2026-03-09", "13:00", "14:30", [17, 1, 6, 7, 15, 8, 12], "Room Turing")
    add(1, None, "1:1 Maya / Daniel", "one_on_one", 5, "2026-03-10", "13:00", "13:30", [1], "Room Hopper")
    add(1, 3, "MOB Sprint 9 planning", "planning", 9, "2026-03-09", "11:00", "12:00", [9, 10, 2, 8, 1, 12], "Zoom")
    add(1, None, "Incident review: checkout outage", "review", 17, "2026-03-12", "15:00", "16:00", [17, 1, 3, 6, 11, 5], "Room Turing")
    # Current week (2026-03-16 .. 2026-03-20).
    add(1, None, "1:1 Maya / Daniel", "one_on_one", 5, "2026-03-17", "13:00", "13:30", [1], "Room Hopper")
    add(1, 1, "Design critique: product page", "meeting", 2, "2026-03-18", "10:00", "11:00", [2, 3, 4, 1, 18], "Room Ada", responses={1: "declined", 18: "tentative"})
    add(1, 1, "Accessibility audit walkthrough", "meeting", 16, "2026-03-18", "11:00", "12:00", [16, 3, 4, 8], "Zoom")
    add(1, 1, "Usability testing session", "meeting", 2, "2026-03-18", "12:00", "13:30", [2, 12, 4], "UX Lab")
    add(1, None, "Checkout performance sync", "meeting", 17, "2026-03-18", "13:00", "14:00", [17, 1, 3], "Room Turing")
    add(1, 2, "Security review: auth service", "review", 15, "2026-03-18", "15:00", "16:00", [15, 1, 6, 17], "Room Lovelace")
    add(1, None, "Vendor demo: feature flag platform", "meeting", 12, "2026-03-19", "10:30", "11:30", [12, 1, 3, 17, 11], "Zoom", responses={1: "pending", 11: "tentative"})
    add(1, None, "Tom Becker - out of office", "time_off", 3, "2026-03-19", "00:00", "2026-03-21T00:00:00", [3])
    add(1, 3, "MOB Sprint 9 review", "review", 9, "2026-03-19", "16:00", "17:00", [9, 10, 2, 8, 1, 12], "Zoom")
    add(1, None, "Engineering all-hands", "meeting", 5, "2026-03-19", "17:00", "18:00", [5, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 15, 16, 17], "Auditorium")
    add(1, 1, "WEB Sprint 14 review", "review", 3, "2026-03-20", "14:00", "15:00", web_team + [12, 5], "Room Ada")
    add(1, 1, "WEB Sprint 14 retro", "retro", 3, "2026-03-20", "15:00", "16:00", web_team, "Room Ada")
    add(1, 2, "API Sprint 22 retro", "retro", 17, "2026-03-20", "11:00", "12:00", [17, 1, 6, 7, 15, 8], "Room Turing")
    add(1, None, "Lunch & learn: Postgres indexing", "meeting", 6, "2026-03-17", "12:00", "13:00", [6, 1, 7, 13, 17], "Kitchen", status="cancelled")
    add(1, None, "Lena Ortiz - dentist", "time_off", 4, "2026-03-17", "14:00", "16:00", [4])
    add(2, 5, "DATA sprint sync", "meeting", 13, "2026-03-17", "15:00", "15:30", [13, 14, 6, 7, 1], "Zoom", responses={1: "tentative"})
    add(2, 5, "Revenue dashboard walkthrough", "review", 14, "2026-03-20", "10:00", "11:00", [14, 13, 12, 1], "Zoom", responses={1: "pending"})
    # Next week.
    add(1, 1, "WEB Sprint 15 planning", "planning", 3, "2026-03-23", "10:00", "11:30", web_team + [12], "Room Ada")
    add(1, 2, "API Sprint 23 planning", "planning", 17, "2026-03-23", "13:00", "14:30", [17, 1, 6, 7, 15, 8, 12], "Room Turing")
    add(1, None, "1:1 Maya / Daniel", "one_on_one", 5, "2026-03-24", "13:00", "13:30", [1], "Room Hopper")
    add(1, 3, "MOB Sprint 10 planning", "planning", 9, "2026-03-23", "11:00", "12:00", [9, 10, 2, 8, 1, 12], "Zoom")
    add(1, None, "Quarterly roadmap review", "meeting", 12, "2026-03-25", "14:00", "16:00", [12, 5, 17, 3, 9, 13], "Auditorium")
    return events, attendees
