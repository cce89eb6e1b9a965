-- Team project tracker (Jira/Linear style): workspaces, projects, members, issues, sprints,
-- comments, time logs, watchers and a team calendar. All timestamps are UTC (TIMESTAMP).

CREATE TABLE users (
    id          BIGSERIAL PRIMARY KEY,
    full_name   TEXT NOT NULL,
    email       TEXT NOT NULL UNIQUE,
    job_title   TEXT NOT NULL,
    timezone    TEXT NOT NULL DEFAULT 'UTC',
    is_active   BOOLEAN NOT NULL DEFAULT TRUE
);

CREATE TABLE workspaces (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL,
    slug        TEXT NOT NULL UNIQUE CHECK (slug ~ '^[a-z0-9-]+$'),
    created_at  TIMESTAMP NOT NULL DEFAULT now()
);

CREATE TABLE workspace_members (
    id            BIGSERIAL PRIMARY KEY,
    workspace_id  BIGINT NOT NULL REFERENCES workspaces(id),
    user_id       BIGINT NOT NULL REFERENCES users(id),
    role          TEXT NOT NULL CHECK (role IN ('owner', 'admin', 'member', 'guest')),
    joined_at     TIMESTAMP NOT NULL DEFAULT now(),
    UNIQUE (workspace_id, user_id)
);

CREATE TABLE projects (
    id            BIGSERIAL PRIMARY KEY,
    workspace_id  BIGINT NOT NULL REFERENCES workspaces(id),
    key           TEXT NOT NULL UNIQUE CHECK (key ~ '^[A-Z][A-Z0-9]{1,9}$'),
    name          TEXT NOT NULL,
    description   TEXT NOT NULL DEFAULT '',
    lead_user_id  BIGINT NOT NULL REFERENCES users(id),
    status        TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'archived')),
    created_at    TIMESTAMP NOT NULL DEFAULT now()
);

CREATE TABLE project_members (
    id          BIGSERIAL PRIMARY KEY,
    project_id  BIGINT NOT NULL REFERENCES projects(id),
    user_id     BIGINT NOT NULL REFERENCES users(id),
    role        TEXT NOT NULL CHECK (role IN ('lead', 'developer', 'reporter', 'viewer')),
    UNIQUE (project_id, user_id)
);

CREATE TABLE labels (
    id          BIGSERIAL PRIMARY KEY,
    project_id  BIGINT NOT NULL REFERENCES projects(id),
    name        TEXT NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9-]*$'),
    color       TEXT NOT NULL CHECK (color ~ '^#[0-9a-f]{6}$'),
    UNIQUE (project_id, name)
);

CREATE TABLE sprints (
    id          BIGSERIAL PRIMARY KEY,
    project_id  BIGINT NOT NULL REFERENCES projects(id),
    name        TEXT NOT NULL,
    goal        TEXT NOT NULL DEFAULT '',
    state       TEXT NOT NULL CHECK (state IN ('planned', 'active', 'closed')),
    start_date  DATE NOT NULL,
    end_date    DATE NOT NULL,
    completed_at TIMESTAMP,
    CHECK (end_date > start_date),
    UNIQUE (project_id, name)
);

CREATE TABLE issues (
    id              BIGSERIAL PRIMARY KEY,
    project_id      BIGINT NOT NULL REFERENCES projects(id),
    number          INTEGER NOT NULL CHECK (number > 0),
    title           TEXT NOT NULL CHECK (length(title) BETWEEN 3 AND 200),
    description     TEXT NOT NULL DEFAULT '',
    type            TEXT NOT NULL CHECK (type IN ('bug', 'task', 'story', 'epic')),
    status          TEXT NOT NULL CHECK (status IN ('backlog', 'todo', 'in_progress', 'in_review', 'done', 'cancelled')),
    priority        TEXT NOT NULL CHECK (priority IN ('urgent', 'high', 'medium', 'low', 'none')),
    reporter_id     BIGINT NOT NULL REFERENCES users(id),
    assignee_id     BIGINT REFERENCES users(id),
    sprint_id       BIGINT REFERENCES sprints(id),
    estimate_points INTEGER CHECK (estimate_points IN (0, 1, 2, 3, 5, 8, 13, 21)),
    due_date        DATE,
    created_at      TIMESTAMP NOT NULL DEFAULT now(),
    updated_at      TIMESTAMP NOT NULL DEFAULT now(),
    resolved_at     TIMESTAMP,
    UNIQUE (project_id, number),
    CHECK (status NOT IN ('in_progress', 'in_review') OR assignee_id IS NOT NULL),
    CHECK ((status IN ('done', 'cancelled')) = (resolved_at IS NOT NULL))
);

CREATE TABLE issue_labels (
    issue_id  BIGINT NOT NULL REFERENCES issues(id) ON DELETE CASCADE,
    label_id  BIGINT NOT NULL REFERENCES labels(id) ON DELETE CASCADE,
    PRIMARY KEY (issue_id, label_id)
);

CREATE TABLE comments (
    id          BIGSERIAL PRIMARY KEY,
    issue_id    BIGINT NOT NULL REFERENCES issues(id) ON DELETE CASCADE,
    author_id   BIGINT NOT NULL REFERENCES users(id),
    body        TEXT NOT NULL CHECK (length(body) BETWEEN 1 AND 5000),
    created_at  TIMESTAMP NOT NULL DEFAULT now()
);

CREATE TABLE time_logs (
    id          BIGSERIAL PRIMARY KEY,
    issue_id    BIGINT NOT NULL REFERENCES issues(id) ON DELETE CASCADE,
    user_id     BIGINT NOT NULL REFERENCES users(id),
    minutes     INTEGER NOT NULL CHECK (minutes BETWEEN 1 AND 720),
    work_date   DATE NOT NULL,
    note        TEXT NOT NULL DEFAULT '',
    created_at  TIMESTAMP NOT NULL DEFAULT now()
);

CREATE TABLE issue_watchers (
    issue_id  BIGINT NOT NULL REFERENCES issues(id) ON DELETE CASCADE,
    user_id   BIGINT NOT NULL REFERENCES users(id),
    added_at  TIMESTAMP NOT NULL DEFAULT now(),
    PRIMARY KEY (issue_id, user_id)
);

CREATE TABLE events (
    id            BIGSERIAL PRIMARY KEY,
    workspace_id  BIGINT NOT NULL REFERENCES workspaces(id),
    project_id    BIGINT REFERENCES projects(id),
    title         TEXT NOT NULL CHECK (length(title) BETWEEN 1 AND 200),
    kind          TEXT NOT NULL CHECK (kind IN ('meeting', 'standup', 'planning', 'review', 'retro', 'one_on_one', 'time_off')),
    organizer_id  BIGINT NOT NULL REFERENCES users(id),
    starts_at     TIMESTAMP NOT NULL,
    ends_at       TIMESTAMP NOT NULL,
    location      TEXT NOT NULL DEFAULT '',
    status        TEXT NOT NULL DEFAULT 'scheduled' CHECK (status IN ('scheduled', 'cancelled')),
    created_at    TIMESTAMP NOT NULL DEFAULT now(),
    CHECK (ends_at > starts_at)
);

CREATE TABLE event_attendees (
    event_id  BIGINT NOT NULL REFERENCES events(id) ON DELETE CASCADE,
    user_id   BIGINT NOT NULL REFERENCES users(id),
    response  TEXT NOT NULL DEFAULT 'pending' CHECK (response IN ('pending', 'accepted', 'declined', 'tentative')),
    PRIMARY KEY (event_id, user_id)
);

CREATE INDEX issues_project_status_idx ON issues (project_id, status);
CREATE INDEX issues_assignee_idx ON issues (assignee_id);
CREATE INDEX issues_sprint_idx ON issues (sprint_id);
CREATE INDEX comments_issue_idx ON comments (issue_id);
CREATE INDEX time_logs_issue_idx ON time_logs (issue_id);
CREATE INDEX time_logs_user_date_idx ON time_logs (user_id, work_date);
CREATE INDEX events_starts_idx ON events (starts_at);
