-- Spokes & Gears: a neighbourhood bicycle shop (sales counter, repair workshop, purchasing).

CREATE TABLE staff (
    id          SERIAL PRIMARY KEY,
    full_name   TEXT NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('manager', 'sales', 'mechanic')),
    email       TEXT NOT NULL UNIQUE,
    active      BOOLEAN NOT NULL DEFAULT TRUE,
    hired_on    DATE NOT NULL
);

CREATE TABLE customers (
    id              SERIAL PRIMARY KEY,
    first_name      TEXT NOT NULL,
    last_name       TEXT NOT NULL,
    email           TEXT NOT NULL UNIQUE,
    phone           TEXT,
    loyalty_points  INTEGER NOT NULL DEFAULT 0 CHECK (loyalty_points >= 0),
    created_at      TIMESTAMP NOT NULL DEFAULT now()
);

CREATE TABLE categories (
    id          SERIAL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    description TEXT
);

CREATE TABLE suppliers (
    id              SERIAL PRIMARY KEY,
    name            TEXT NOT NULL UNIQUE,
    contact_email   TEXT NOT NULL,
    phone           TEXT,
    lead_time_days  INTEGER NOT NULL CHECK (lead_time_days > 0)
);

CREATE TABLE products (
    id             SERIAL PRIMARY KEY,
    sku            TEXT NOT NULL UNIQUE,
    name           TEXT NOT NULL,
    category_id    INTEGER NOT NULL REFERENCES categories(id),
    supplier_id    INTEGER NOT NULL REFERENCES suppliers(id),
    price          NUMERIC(10, 2) NOT NULL CHECK (price > 0),
    cost           NUMERIC(10, 2) NOT NULL CHECK (cost >= 0),
    stock_qty      INTEGER NOT NULL DEFAULT 0 CHECK (stock_qty >= 0),
    reorder_level  INTEGER NOT NULL DEFAULT 0 CHECK (reorder_level >= 0),
    active         BOOLEAN NOT NULL DEFAULT TRUE
);

CREATE TABLE bikes (
    id             SERIAL PRIMARY KEY,
    customer_id    INTEGER NOT NULL REFERENCES customers(id),
    brand          TEXT NOT NULL,
    model          TEXT NOT NULL,
    bike_type      TEXT NOT NULL CHECK (bike_type IN ('road', 'mountain', 'hybrid', 'gravel', 'city', 'e-bike', 'kids')),
    serial_number  TEXT NOT NULL UNIQUE,
    color          TEXT,
    model_year     INTEGER CHECK (model_year BETWEEN 1970 AND 2027)
);

CREATE TABLE sales (
    id              SERIAL PRIMARY KEY,
    customer_id     INTEGER REFERENCES customers(id),
    staff_id        INTEGER NOT NULL REFERENCES staff(id),
    status          TEXT NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'completed', 'refunded', 'voided')),
    payment_method  TEXT NOT NULL CHECK (payment_method IN ('cash', 'card', 'gift_card')),
    created_at      TIMESTAMP NOT NULL DEFAULT now(),
    completed_at    TIMESTAMP,
    refunded_at     TIMESTAMP,
    refund_reason   TEXT,
    total           NUMERIC(10, 2) NOT NULL DEFAULT 0
);

CREATE TABLE sale_items (
    id          SERIAL PRIMARY KEY,
    sale_id     INTEGER NOT NULL REFERENCES sales(id),
    product_id  INTEGER NOT NULL REFERENCES products(id),
    quantity    INTEGER NOT NULL CHECK (quantity > 0),
    unit_price  NUMERIC(10, 2) NOT NULL CHECK (unit_price >= 0),
    UNIQUE (sale_id, product_id)
);

CREATE TABLE service_types (
    id           SERIAL PRIMARY KEY,
    code         TEXT NOT NULL UNIQUE,
    name         TEXT NOT NULL,
    base_price   NUMERIC(10, 2) NOT NULL CHECK (base_price >= 0),
    est_minutes  INTEGER NOT NULL CHECK (est_minutes > 0)
);

CREATE TABLE repair_orders (
    id               SERIAL PRIMARY KEY,
    bike_id          INTEGER NOT NULL REFERENCES bikes(id),
    service_type_id  INTEGER NOT NULL REFERENCES service_types(id),
    mechanic_id      INTEGER REFERENCES staff(id),
    status           TEXT NOT NULL DEFAULT 'received'
                     CHECK (status IN ('received', 'in_progress', 'waiting_parts', 'completed', 'picked_up', 'cancelled')),
    labor_price      NUMERIC(10, 2) NOT NULL CHECK (labor_price >= 0),
    notes            TEXT,
    dropped_off_at   TIMESTAMP NOT NULL DEFAULT now(),
    due_date         DATE NOT NULL,
    completed_at     TIMESTAMP,
    picked_up_at     TIMESTAMP,
    cancel_reason    TEXT
);

CREATE TABLE repair_parts (
    id               SERIAL PRIMARY KEY,
    repair_order_id  INTEGER NOT NULL REFERENCES repair_orders(id),
    product_id       INTEGER NOT NULL REFERENCES products(id),
    quantity         INTEGER NOT NULL CHECK (quantity > 0),
    unit_price       NUMERIC(10, 2) NOT NULL CHECK (unit_price >= 0)
);

CREATE TABLE purchase_orders (
    id           SERIAL PRIMARY KEY,
    supplier_id  INTEGER NOT NULL REFERENCES suppliers(id),
    created_by   INTEGER NOT NULL REFERENCES staff(id),
    status       TEXT NOT NULL DEFAULT 'draft' CHECK (status IN ('draft', 'ordered', 'received', 'cancelled')),
    notes        TEXT,
    created_at   TIMESTAMP NOT NULL DEFAULT now(),
    ordered_at   TIMESTAMP,
    received_at  TIMESTAMP
);

CREATE TABLE purchase_order_items (
    id                 SERIAL PRIMARY KEY,
    purchase_order_id  INTEGER NOT NULL REFERENCES purchase_orders(id),
    product_id         INTEGER NOT NULL REFERENCES products(id),
    quantity           INTEGER NOT NULL CHECK (quantity > 0),
    unit_cost          NUMERIC(10, 2) NOT NULL CHECK (unit_cost >= 0),
    UNIQUE (purchase_order_id, product_id)
);
