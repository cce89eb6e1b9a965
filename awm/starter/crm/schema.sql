-- B2B sales CRM: teams and reps, accounts with contacts, leads, opportunities moving through a
-- pipeline, activities and tasks, a product catalogue and quotes with line items.

CREATE TABLE teams (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    region      TEXT NOT NULL,
    segment     TEXT NOT NULL CHECK (segment IN ('enterprise', 'mid_market', 'smb'))
);

CREATE TABLE users (
    id               BIGSERIAL PRIMARY KEY,
    full_name        TEXT NOT NULL,
    email            TEXT NOT NULL UNIQUE,
    role             TEXT NOT NULL CHECK (role IN ('rep', 'manager', 'sales_ops')),
    team_id          BIGINT REFERENCES teams (id),
    quarterly_quota  NUMERIC(12, 2) NOT NULL DEFAULT 0 CHECK (quarterly_quota >= 0),
    is_active        BOOLEAN NOT NULL DEFAULT TRUE,
    hired_on         DATE NOT NULL
);

CREATE TABLE accounts (
    id              BIGSERIAL PRIMARY KEY,
    name            TEXT NOT NULL,
    industry        TEXT NOT NULL,
    type            TEXT NOT NULL DEFAULT 'prospect'
                    CHECK (type IN ('prospect', 'customer', 'partner', 'churned')),
    employees       INTEGER CHECK (employees >= 0),
    annual_revenue  NUMERIC(14, 2) CHECK (annual_revenue >= 0),
    website         TEXT,
    phone           TEXT,
    city            TEXT,
    state           TEXT,
    country         TEXT NOT NULL DEFAULT 'US',
    owner_id        BIGINT NOT NULL REFERENCES users (id),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX accounts_name_unique ON accounts (lower(name));
CREATE INDEX accounts_owner_idx ON accounts (owner_id);

CREATE TABLE contacts (
    id          BIGSERIAL PRIMARY KEY,
    account_id  BIGINT NOT NULL REFERENCES accounts (id),
    first_name  TEXT NOT NULL,
    last_name   TEXT NOT NULL,
    title       TEXT,
    email       TEXT NOT NULL,
    phone       TEXT,
    is_primary  BOOLEAN NOT NULL DEFAULT FALSE,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX contacts_email_unique ON contacts (lower(email));
CREATE UNIQUE INDEX contacts_one_primary_per_account ON contacts (account_id) WHERE is_primary;
CREATE INDEX contacts_account_idx ON contacts (account_id);

CREATE TABLE products (
    id          BIGSERIAL PRIMARY KEY,
    sku         TEXT NOT NULL UNIQUE,
    name        TEXT NOT NULL,
    family      TEXT NOT NULL CHECK (family IN ('subscription', 'add_on', 'services', 'support')),
    billing     TEXT NOT NULL CHECK (billing IN ('annual', 'one_time')),
    unit_price  NUMERIC(12, 2) NOT NULL CHECK (unit_price >= 0),
    is_active   BOOLEAN NOT NULL DEFAULT TRUE
);

CREATE TABLE opportunities (
    id                   BIGSERIAL PRIMARY KEY,
    account_id           BIGINT NOT NULL REFERENCES accounts (id),
    name                 TEXT NOT NULL,
    owner_id             BIGINT NOT NULL REFERENCES users (id),
    stage                TEXT NOT NULL CHECK (stage IN ('prospecting', 'qualification', 'proposal',
                                                        'negotiation', 'closed_won', 'closed_lost')),
    amount               NUMERIC(12, 2) NOT NULL DEFAULT 0 CHECK (amount >= 0),
    probability          INTEGER NOT NULL CHECK (probability BETWEEN 0 AND 100),
    expected_close_date  DATE NOT NULL,
    primary_contact_id   BIGINT REFERENCES contacts (id),
    lead_source          TEXT,
    loss_reason          TEXT,
    closed_on            DATE,
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (stage <> 'closed_lost' OR loss_reason IS NOT NULL),
    CHECK ((stage IN ('closed_won', 'closed_lost')) = (closed_on IS NOT NULL))
);
CREATE INDEX opportunities_owner_idx ON opportunities (owner_id);
CREATE INDEX opportunities_account_idx ON opportunities (account_id);

CREATE TABLE leads (
    id                        BIGSERIAL PRIMARY KEY,
    first_name                TEXT NOT NULL,
    last_name                 TEXT NOT NULL,
    title                     TEXT,
    company                   TEXT NOT NULL,
    email                     TEXT NOT NULL,
    phone                     TEXT,
    source                    TEXT NOT NULL CHECK (source IN ('website', 'referral', 'trade_show',
                                                              'webinar', 'cold_outreach', 'partner')),
    status                    TEXT NOT NULL DEFAULT 'new'
                              CHECK (status IN ('new', 'contacted', 'qualified', 'unqualified',
                                                'converted')),
    owner_id                  BIGINT NOT NULL REFERENCES users (id),
    disqualify_reason         TEXT,
    converted_account_id      BIGINT REFERENCES accounts (id),
    converted_contact_id      BIGINT REFERENCES contacts (id),
    converted_opportunity_id  BIGINT REFERENCES opportunities (id),
    converted_at              TIMESTAMPTZ,
    created_at                TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (status <> 'unqualified' OR disqualify_reason IS NOT NULL),
    CHECK ((status = 'converted') = (converted_contact_id IS NOT NULL))
);
CREATE UNIQUE INDEX leads_email_unique ON leads (lower(email));
CREATE INDEX leads_owner_idx ON leads (owner_id);

CREATE TABLE opportunity_stage_history (
    id              BIGSERIAL PRIMARY KEY,
    opportunity_id  BIGINT NOT NULL REFERENCES opportunities (id),
    from_stage      TEXT,
    to_stage        TEXT NOT NULL,
    changed_by      BIGINT NOT NULL REFERENCES users (id),
    changed_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX stage_history_opportunity_idx ON opportunity_stage_history (opportunity_id);

CREATE TABLE quotes (
    id              BIGSERIAL PRIMARY KEY,
    quote_number    TEXT NOT NULL UNIQUE,
    opportunity_id  BIGINT NOT NULL REFERENCES opportunities (id),
    status          TEXT NOT NULL DEFAULT 'draft'
                    CHECK (status IN ('draft', 'sent', 'accepted', 'rejected')),
    valid_until     DATE NOT NULL,
    notes           TEXT,
    created_by      BIGINT NOT NULL REFERENCES users (id),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    sent_at         TIMESTAMPTZ,
    decided_at      TIMESTAMPTZ
);
CREATE UNIQUE INDEX quotes_one_accepted_per_opportunity ON quotes (opportunity_id)
    WHERE status = 'accepted';

CREATE TABLE quote_lines (
    id            BIGSERIAL PRIMARY KEY,
    quote_id      BIGINT NOT NULL REFERENCES quotes (id) ON DELETE CASCADE,
    product_id    BIGINT NOT NULL REFERENCES products (id),
    quantity      INTEGER NOT NULL CHECK (quantity > 0),
    unit_price    NUMERIC(12, 2) NOT NULL CHECK (unit_price >= 0),
    discount_pct  NUMERIC(5, 2) NOT NULL DEFAULT 0 CHECK (discount_pct BETWEEN 0 AND 100),
    UNIQUE (quote_id, product_id)
);

CREATE TABLE activities (
    id                BIGSERIAL PRIMARY KEY,
    type              TEXT NOT NULL CHECK (type IN ('call', 'email', 'meeting', 'note')),
    subject           TEXT NOT NULL,
    body              TEXT,
    user_id           BIGINT NOT NULL REFERENCES users (id),
    account_id        BIGINT REFERENCES accounts (id),
    contact_id        BIGINT REFERENCES contacts (id),
    opportunity_id    BIGINT REFERENCES opportunities (id),
    lead_id           BIGINT REFERENCES leads (id),
    duration_minutes  INTEGER CHECK (duration_minutes >= 0),
    occurred_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (account_id IS NOT NULL OR lead_id IS NOT NULL)
);
CREATE INDEX activities_account_idx ON activities (account_id);
CREATE INDEX activities_opportunity_idx ON activities (opportunity_id);

CREATE TABLE tasks (
    id              BIGSERIAL PRIMARY KEY,
    title           TEXT NOT NULL,
    description     TEXT,
    due_date        DATE NOT NULL,
    priority        TEXT NOT NULL DEFAULT 'normal' CHECK (priority IN ('low', 'normal', 'high')),
    status          TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'completed', 'cancelled')),
    assigned_to     BIGINT NOT NULL REFERENCES users (id),
    created_by      BIGINT NOT NULL REFERENCES users (id),
    account_id      BIGINT REFERENCES accounts (id),
    contact_id      BIGINT REFERENCES contacts (id),
    opportunity_id  BIGINT REFERENCES opportunities (id),
    lead_id         BIGINT REFERENCES leads (id),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at    TIMESTAMPTZ,
    CHECK ((status = 'completed') = (completed_at IS NOT NULL))
);
CREATE INDEX tasks_assignee_idx ON tasks (assigned_to, status);
