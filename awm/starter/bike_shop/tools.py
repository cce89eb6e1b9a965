"""Tools of the Spokes & Gears bicycle shop; the acting user is staff member Maya Lin (id 2)."""

import datetime
import re
from typing import Literal

ACTING_STAFF_ID = 2
OPEN_REPAIR_STATUSES = ("received", "in_progress", "waiting_parts")
REPAIR_TRANSITIONS = {
    "received": ("in_progress",),
    "in_progress": ("waiting_parts", "completed"),
    "waiting_parts": ("in_progress",),
    "completed": ("picked_up",),
    "picked_up": (),
    "cancelled": (),
}
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$", re.IGNORECASE)


def _date(value, name):
    try:
        return datetime.date.fromisoformat(value).isoformat()
    except (TypeError, ValueError):
        raise ToolError(f"{name} must be a date in YYYY-MM-DD format, got {value!r}")


def _limit(limit):
    if limit < 1 or limit > 200:
        raise ToolError("limit must be between 1 and 200")
    return limit


def _customer(db, customer_id):
    row = db.one("SELECT * FROM customers WHERE id = %s", customer_id)
    if row is None:
        raise ToolError(f"customer {customer_id} not found")
    return row


def _product_by_sku(db, sku):
    row = db.one("SELECT * FROM products WHERE upper(sku) = upper(%s)", sku.strip())
    if row is None:
        raise ToolError(f"no product with SKU {sku!r}")
    return row


def _sale(db, sale_id):
    row = db.one("SELECT * FROM sales WHERE id = %s", sale_id)
    if row is None:
        raise ToolError(f"sale {sale_id} not found")
    return row


def _repair(db, repair_order_id):
    row = db.one("SELECT * FROM repair_orders WHERE id = %s", repair_order_id)
    if row is None:
        raise ToolError(f"repair order {repair_order_id} not found")
    return row


def _purchase_order(db, purchase_order_id):
    row = db.one("SELECT * FROM purchase_orders WHERE id = %s", purchase_order_id)
    if row is None:
        raise ToolError(f"purchase order {purchase_order_id} not found")
    return row


def _sale_detail(db, sale_id):
    sale = db.one(
        "SELECT s.*, c.first_name || ' ' || c.last_name AS customer_name, st.full_name AS staff_name "
        "FROM sales s LEFT JOIN customers c ON c.id = s.customer_id JOIN staff st ON st.id = s.staff_id "
        "WHERE s.id = %s",
        sale_id,
    )
    if sale is None:
        raise ToolError(f"sale {sale_id} not found")
    sale["items"] = db.query(
        "SELECT si.id, p.sku, p.name, si.quantity, si.unit_price, si.quantity * si.unit_price AS line_total "
        "FROM sale_items si JOIN products p ON p.id = si.product_id WHERE si.sale_id = %s ORDER BY si.id",
        sale_id,
    )
    return sale


def _repair_detail(db, repair_order_id):
    ro = db.one(
        "SELECT r.*, st.code AS service_code, st.name AS service_name, b.brand, b.model, b.serial_number, "
        "b.customer_id, c.first_name || ' ' || c.last_name AS customer_name, m.full_name AS mechanic_name "
        "FROM repair_orders r JOIN service_types st ON st.id = r.service_type_id "
        "JOIN bikes b ON b.id = r.bike_id JOIN customers c ON c.id = b.customer_id "
        "LEFT JOIN staff m ON m.id = r.mechanic_id WHERE r.id = %s",
        repair_order_id,
    )
    if ro is None:
        raise ToolError(f"repair order {repair_order_id} not found")
    ro["parts"] = db.query(
        "SELECT rp.id, p.sku, p.name, rp.quantity, rp.unit_price, rp.quantity * rp.unit_price AS line_total "
        "FROM repair_parts rp JOIN products p ON p.id = rp.product_id WHERE rp.repair_order_id = %s ORDER BY rp.id",
        repair_order_id,
    )
    parts_total = db.scalar(
        "SELECT COALESCE(SUM(quantity * unit_price), 0) FROM repair_parts WHERE repair_order_id = %s",
        repair_order_id,
    )
    ro["parts_total"] = parts_total
    ro["total"] = round(ro["labor_price"] + parts_total, 2)
    return ro


def _po_detail(db, purchase_order_id):
    po = db.one(
        "SELECT po.*, s.name AS supplier_name, st.full_name AS created_by_name FROM purchase_orders po "
        "JOIN suppliers s ON s.id = po.supplier_id JOIN staff st ON st.id = po.created_by WHERE po.id = %s",
        purchase_order_id,
    )
    if po is None:
        raise ToolError(f"purchase order {purchase_order_id} not found")
    po["items"] = db.query(
        "SELECT i.id, p.sku, p.name, i.quantity, i.unit_cost, i.quantity * i.unit_cost AS line_total "
        "FROM purchase_order_items i JOIN products p ON p.id = i.product_id "
        "WHERE i.purchase_order_id = %s ORDER BY i.id",
        purchase_order_id,
    )
    po["total_cost"] = db.scalar(
        "SELECT COALESCE(SUM(quantity * unit_cost), 0) FROM purchase_order_items WHERE purchase_order_id = %s",
        purchase_order_id,
    )
    return po


# --------------------------------------------------------------------------- customers


def search_customers(db, query: str = "", limit: int = 20) -> list[dict]:
    """Search customers by name, email or phone (case-insensitive substring match).

    Args:
        query: Text to look for in first name, last name, full name, email or phone. Empty lists all.
        limit: Maximum number of customers to return (1-200).
    """
    pattern = f"%{query.strip()}%"
    return db.query(
        "SELECT id, first_name, last_name, email, phone, loyalty_points FROM customers "
        "WHERE first_name || ' ' || last_name ILIKE %s OR email ILIKE %s OR COALESCE(phone, '') ILIKE %s "
        "ORDER BY last_name, first_name, id LIMIT %s",
        pattern, pattern, pattern, _limit(limit),
    )


def get_customer(db, customer_id: int) -> dict:
    """Get one customer with their registered bikes and a summary of purchases and repairs.

    Args:
        customer_id: The customer's id.
    """
    customer = _customer(db, customer_id)
    customer["bikes"] = db.query(
        "SELECT id, brand, model, bike_type, serial_number, color, model_year FROM bikes "
        "WHERE customer_id = %s ORDER BY id",
        customer_id,
    )
    customer["completed_sales"] = db.scalar(
        "SELECT count(*) FROM sales WHERE customer_id = %s AND status = 'completed'", customer_id
    )
    customer["active_repair_orders"] = db.query(
        "SELECT r.id, r.status, r.bike_id FROM repair_orders r JOIN bikes b ON b.id = r.bike_id "
        "WHERE b.customer_id = %s AND r.status IN ('received', 'in_progress', 'waiting_parts', 'completed') "
        "ORDER BY r.id",
        customer_id,
    )
    return customer


def create_customer(db, first_name: str, last_name: str, email: str, phone: str | None = None) -> dict:
    """Create a new customer record. The email address must be unique.

    Args:
        first_name: Given name.
        last_name: Family name.
        email: Email address (must not already belong to another customer).
        phone: Phone number, optional.
    """
    first_name, last_name, email = first_name.strip(), last_name.strip(), email.strip().lower()
    if not first_name or not last_name:
        raise ToolError("first_name and last_name are required")
    if not _EMAIL.match(email):
        raise ToolError(f"invalid email address {email!r}")
    clash = db.one("SELECT id FROM customers WHERE lower(email) = %s", email)
    if clash:
        raise ToolError(f"email {email} already belongs to customer {clash['id']}")
    return db.one(
        "INSERT INTO customers (first_name, last_name, email, phone, loyalty_points, created_at) "
        "VALUES (%s, %s, %s, %s, 0, now()) RETURNING *",
        first_name, last_name, email, phone.strip() if phone else None,
    )


def update_customer_contact(db, customer_id: int, email: str | None = None, phone: str | None = None) -> dict:
    """Change a customer's email address and/or phone number.

    Args:
        customer_id: The customer's id.
        email: New email address (must be unique), or omit to keep the current one.
        phone: New phone number, or omit to keep the current one.
    """
    customer = _customer(db, customer_id)
    if email is None and phone is None:
        raise ToolError("give at least one of email or phone")
    if email is not None:
        email = email.strip().lower()
        if not _EMAIL.match(email):
            raise ToolError(f"invalid email address {email!r}")
        clash = db.one("SELECT id FROM customers WHERE lower(email) = %s AND id <> %s", email, customer_id)
        if clash:
            raise ToolError(f"email {email} already belongs to customer {clash['id']}")
    return db.one(
        "UPDATE customers SET email = %s, phone = %s WHERE id = %s RETURNING *",
        email if email is not None else customer["email"],
        phone.strip() if phone is not None else customer["phone"],
        customer_id,
    )


# --------------------------------------------------------------------------- bikes


def search_bikes(
    db,
    query: str = "",
    customer_id: int | None = None,
    bike_type: Literal["road", "mountain", "hybrid", "gravel", "city", "e-bike", "kids"] | None = None,
    limit: int = 20,
) -> list[dict]:
    """Search customers' registered bikes by serial number, brand or model.

    Args:
        query: Text to look for in serial number, brand or model. Empty matches all.
        customer_id: Only bikes owned by this customer.
        bike_type: Only bikes of this type.
        limit: Maximum number of bikes to return (1-200).
    """
    pattern = f"%{query.strip()}%"
    return db.query(
        "SELECT b.*, c.first_name || ' ' || c.last_name AS owner_name FROM bikes b "
        "JOIN customers c ON c.id = b.customer_id "
        "WHERE (b.serial_number ILIKE %s OR b.brand || ' ' || b.model ILIKE %s) "
        "AND (%s::int IS NULL OR b.customer_id = %s::int) AND (%s::text IS NULL OR b.bike_type = %s::text) "
        "ORDER BY b.id LIMIT %s",
        pattern, pattern, customer_id, customer_id, bike_type, bike_type, _limit(limit),
    )


def register_bike(
    db,
    customer_id: int,
    brand: str,
    model: str,
    bike_type: Literal["road", "mountain", "hybrid", "gravel", "city", "e-bike", "kids"],
    serial_number: str,
    color: str | None = None,
    model_year: int | None = None,
) -> dict:
    """Register a bike to a customer. Serial numbers are unique across the shop.

    Args:
        customer_id: Owner of the bike.
        brand: Manufacturer, e.g. Trek.
        model: Model name, e.g. FX 3.
        bike_type: Kind of bike.
        serial_number: Frame serial number (stored upper-case).
        color: Main frame color.
        model_year: Model year (1970-2027).
    """
    _customer(db, customer_id)
    serial = serial_number.strip().upper()
    if not serial or not brand.strip() or not model.strip():
        raise ToolError("brand, model and serial_number are required")
    if model_year is not None and not 1970 <= model_year <= 2027:
        raise ToolError("model_year must be between 1970 and 2027")
    other = db.one("SELECT id, customer_id FROM bikes WHERE upper(serial_number) = %s", serial)
    if other:
        raise ToolError(f"serial number {serial} is already registered (bike {other['id']}, customer {other['customer_id']})")
    return db.one(
        "INSERT INTO bikes (customer_id, brand, model, bike_type, serial_number, color, model_year) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING *",
        customer_id, brand.strip(), model.strip(), bike_type, serial, color.strip().lower() if color else None, model_year,
    )


# --------------------------------------------------------------------------- catalog


def list_categories(db) -> list[dict]:
    """List product categories with the number of active products in each."""
    return db.query(
        "SELECT c.id, c.name, c.description, count(p.id) FILTER (WHERE p.active) AS active_products "
        "FROM categories c LEFT JOIN products p ON p.category_id = c.id GROUP BY c.id ORDER BY c.id"
    )


def search_products(
    db,
    query: str = "",
    category: str | None = None,
    supplier_id: int | None = None,
    in_stock_only: bool = False,
    max_price: float | None = None,
    include_inactive: bool = False,
    limit: int = 20,
) -> list[dict]:
    """Search the product catalog by name or SKU with optional filters.

    Args:
        query: Text to look for in product name or SKU. Empty matches all.
        category: Category name, exact (case-insensitive), e.g. "Tires & Tubes".
        supplier_id: Only products from this supplier.
        in_stock_only: Only products with stock_qty > 0.
        max_price: Only products priced at or below this.
        include_inactive: Also return discontinued products.
        limit: Maximum number of products to return (1-200).
    """
    pattern = f"%{query.strip()}%"
    return db.query(
        "SELECT p.id, p.sku, p.name, c.name AS category, p.supplier_id, p.price, p.stock_qty, "
        "p.reorder_level, p.active FROM products p JOIN categories c ON c.id = p.category_id "
        "WHERE (p.name ILIKE %s OR p.sku ILIKE %s) AND (%s::text IS NULL OR lower(c.name) = lower(%s::text)) "
        "AND (%s::int IS NULL OR p.supplier_id = %s::int) AND (NOT %s OR p.stock_qty > 0) "
        "AND (%s::numeric IS NULL OR p.price <= %s::numeric) AND (%s OR p.active) "
        "ORDER BY p.id LIMIT %s",
        pattern, pattern, category, category, supplier_id, supplier_id, in_stock_only,
        max_price, max_price, include_inactive, _limit(limit),
    )


def get_product(db, product_id: int | None = None, sku: str | None = None) -> dict:
    """Get one product (by id or SKU) with its category, supplier and supplier lead time.

    Args:
        product_id: The product id.
        sku: The product SKU (used if product_id is not given).
    """
    if product_id is None and not sku:
        raise ToolError("give product_id or sku")
    if product_id is None:
        product_id = _product_by_sku(db, sku)["id"]
    row = db.one(
        "SELECT p.*, c.name AS category, s.name AS supplier_name, s.lead_time_days AS supplier_lead_time_days "
        "FROM products p JOIN categories c ON c.id = p.category_id JOIN suppliers s ON s.id = p.supplier_id "
        "WHERE p.id = %s",
        product_id,
    )
    if row is None:
        raise ToolError(f"product {product_id} not found")
    return row


def list_low_stock_products(db, supplier_id: int | None = None, limit: int = 50) -> list[dict]:
    """List active products whose stock is at or below their reorder level.

    Args:
        supplier_id: Only products from this supplier.
        limit: Maximum number of products to return (1-200).
    """
    return db.query(
        "SELECT p.id, p.sku, p.name, p.stock_qty, p.reorder_level, p.cost, p.supplier_id, s.name AS supplier_name "
        "FROM products p JOIN suppliers s ON s.id = p.supplier_id "
        "WHERE p.active AND p.stock_qty <= p.reorder_level AND (%s::int IS NULL OR p.supplier_id = %s::int) "
        "ORDER BY p.supplier_id, p.id LIMIT %s",
        supplier_id, supplier_id, _limit(limit),
    )


def update_product_price(db, product_id: int, new_price: float) -> dict:
    """Change the shelf price of an active product. The price may not be below the product's cost.

    Args:
        product_id: The product id.
        new_price: New price in dollars (two decimals).
    """
    product = db.one("SELECT * FROM products WHERE id = %s", product_id)
    if product is None:
        raise ToolError(f"product {product_id} not found")
    if not product["active"]:
        raise ToolError(f"product {product['sku']} is discontinued; its price cannot be changed")
    if new_price <= 0:
        raise ToolError("new_price must be positive")
    if round(new_price, 2) < product["cost"]:
        raise ToolError(f"new price {new_price:.2f} is below the cost {product['cost']} of {product['sku']}")
    return db.one(
        "UPDATE products SET price = round(%s::numeric, 2) WHERE id = %s RETURNING id, sku, name, price, cost",
        new_price, product_id,
    )


def product_sales_summary(db, product_id: int, date_from: str | None = None, date_to: str | None = None) -> dict:
    """Units sold and revenue of one product over completed sales (refunded and voided sales excluded).

    Args:
        product_id: The product id.
        date_from: First sale date included (YYYY-MM-DD), optional.
        date_to: Last sale date included (YYYY-MM-DD), optional.
    """
    product = db.one("SELECT id, sku, name FROM products WHERE id = %s", product_id)
    if product is None:
        raise ToolError(f"product {product_id} not found")
    d1 = _date(date_from, "date_from") if date_from else None
    d2 = _date(date_to, "date_to") if date_to else None
    row = db.one(
        "SELECT COALESCE(SUM(si.quantity), 0) AS units_sold, COALESCE(SUM(si.quantity * si.unit_price), 0) AS revenue, "
        "count(DISTINCT s.id) AS sales_count FROM sale_items si JOIN sales s ON s.id = si.sale_id "
        "WHERE si.product_id = %s AND s.status = 'completed' "
        "AND (%s::date IS NULL OR s.created_at::date >= %s::date) AND (%s::date IS NULL OR s.created_at::date <= %s::date)",
        product_id, d1, d1, d2, d2,
    )
    return {**product, "date_from": d1, "date_to": d2, **row}


# --------------------------------------------------------------------------- sales


def create_sale(db, payment_method: Literal["cash", "card", "gift_card"], customer_id: int | None = None) -> dict:
    """Open a new sale (cart) rung up by you (Maya Lin). Add items, then complete it.

    Args:
        payment_method: How the customer pays.
        customer_id: The buying customer, or omit for a walk-in sale without loyalty points.
    """
    if customer_id is not None:
        _customer(db, customer_id)
    return db.one(
        "INSERT INTO sales (customer_id, staff_id, status, payment_method, created_at, total) "
        "VALUES (%s, %s, 'open', %s, now(), 0) RETURNING *",
        customer_id, ACTING_STAFF_ID, payment_method,
    )


def add_sale_item(db, sale_id: int, sku: str, quantity: int = 1) -> dict:
    """Add a product to an open sale at its current price (adding the same SKU again raises the quantity).

    Args:
        sale_id: The open sale.
        sku: Product SKU.
        quantity: Number of units (at least 1); the total in the sale may not exceed stock.
    """
    sale = _sale(db, sale_id)
    if sale["status"] != "open":
        raise ToolError(f"sale {sale_id} is {sale['status']}; items can only be added to an open sale")
    if quantity < 1:
        raise ToolError("quantity must be at least 1")
    product = _product_by_sku(db, sku)
    if not product["active"]:
        raise ToolError(f"product {product['sku']} is discontinued and cannot be sold")
    existing = db.one("SELECT * FROM sale_items WHERE sale_id = %s AND product_id = %s", sale_id, product["id"])
    wanted = quantity + (existing["quantity"] if existing else 0)
    if wanted > product["stock_qty"]:
        raise ToolError(f"only {product['stock_qty']} units of {product['sku']} in stock (requested {wanted})")
    if existing:
        db.execute("UPDATE sale_items SET quantity = %s WHERE id = %s", wanted, existing["id"])
    else:
        db.execute(
            "INSERT INTO sale_items (sale_id, product_id, quantity, unit_price) VALUES (%s, %s, %s, %s)",
            sale_id, product["id"], quantity, product["price"],
        )
    db.execute(
        "UPDATE sales SET total = (SELECT COALESCE(SUM(quantity * unit_price), 0) FROM sale_items WHERE sale_id = %s) "
        "WHERE id = %s",
        sale_id, sale_id,
    )
    return _sale_detail(db, sale_id)


def remove_sale_item(db, sale_id: int, sku: str) -> dict:
    """Remove a product line from an open sale.

    Args:
        sale_id: The open sale.
        sku: SKU of the line to remove.
    """
    sale = _sale(db, sale_id)
    if sale["status"] != "open":
        raise ToolError(f"sale {sale_id} is {sale['status']}; items can only be removed from an open sale")
    product = _product_by_sku(db, sku)
    if db.execute("DELETE FROM sale_items WHERE sale_id = %s AND product_id = %s", sale_id, product["id"]) == 0:
        raise ToolError(f"sale {sale_id} has no line for {product['sku']}")
    db.execute(
        "UPDATE sales SET total = (SELECT COALESCE(SUM(quantity * unit_price), 0) FROM sale_items WHERE sale_id = %s) "
        "WHERE id = %s",
        sale_id, sale_id,
    )
    return _sale_detail(db, sale_id)


def complete_sale(db, sale_id: int) -> dict:
    """Complete (pay) an open sale: takes the items out of stock and awards the customer one loyalty point per whole dollar.

    Args:
        sale_id: The open sale.
    """
    sale = _sale(db, sale_id)
    if sale["status"] != "open":
        raise ToolError(f"sale {sale_id} is {sale['status']}, not open")
    lines = db.query(
        "SELECT si.product_id, si.quantity, p.sku, p.stock_qty FROM sale_items si "
        "JOIN products p ON p.id = si.product_id WHERE si.sale_id = %s",
        sale_id,
    )
    if not lines:
        raise ToolError(f"sale {sale_id} has no items")
    for line in lines:
        if line["quantity"] > line["stock_qty"]:
            raise ToolError(f"not enough stock of {line['sku']}: {line['stock_qty']} left, {line['quantity']} in sale")
    for line in lines:
        db.execute("UPDATE products SET stock_qty = stock_qty - %s WHERE id = %s", line["quantity"], line["product_id"])
    db.execute(
        "UPDATE sales SET status = 'completed', completed_at = now(), "
        "total = (SELECT SUM(quantity * unit_price) FROM sale_items WHERE sale_id = %s) WHERE id = %s",
        sale_id, sale_id,
    )
    if sale["customer_id"] is not None:
        db.execute(
            "UPDATE customers SET loyalty_points = loyalty_points + (SELECT floor(total)::int FROM sales WHERE id = %s) "
            "WHERE id = %s",
            sale_id, sale["customer_id"],
        )
    return _sale_detail(db, sale_id)


def void_sale(db, sale_id: int) -> dict:
    """Void an open sale that the customer abandoned (nothing leaves stock).

    Args:
        sale_id: The open sale.
    """
    sale = _sale(db, sale_id)
    if sale["status"] != "open":
        raise ToolError(f"only open sales can be voided; sale {sale_id} is {sale['status']}")
    db.execute("UPDATE sales SET status = 'voided', total = 0 WHERE id = %s", sale_id)
    return _sale_detail(db, sale_id)


def refund_sale(db, sale_id: int, reason: str) -> dict:
    """Refund a completed sale in full: returns all items to stock and removes the loyalty points it earned.

    Args:
        sale_id: The completed sale.
        reason: Why the customer returned the items.
    """
    sale = _sale(db, sale_id)
    if sale["status"] != "completed":
        raise ToolError(f"only completed sales can be refunded; sale {sale_id} is {sale['status']}")
    if not reason.strip():
        raise ToolError("a refund reason is required")
    for line in db.query("SELECT product_id, quantity FROM sale_items WHERE sale_id = %s", sale_id):
        db.execute("UPDATE products SET stock_qty = stock_qty + %s WHERE id = %s", line["quantity"], line["product_id"])
    db.execute(
        "UPDATE sales SET status = 'refunded', refunded_at = now(), refund_reason = %s WHERE id = %s",
        reason.strip(), sale_id,
    )
    if sale["customer_id"] is not None:
        db.execute(
            "UPDATE customers SET loyalty_points = GREATEST(loyalty_points - floor(%s::numeric)::int, 0) WHERE id = %s",
            sale["total"], sale["customer_id"],
        )
    return _sale_detail(db, sale_id)


def get_sale(db, sale_id: int) -> dict:
    """Get one sale with its line items.

    Args:
        sale_id: The sale id.
    """
    return _sale_detail(db, sale_id)


def list_sales(
    db,
    customer_id: int | None = None,
    status: Literal["open", "completed", "refunded", "voided"] | None = None,
    date_from: str | None = None,
    date_to: str | None = None,
    limit: int = 50,
) -> list[dict]:
    """List sales, newest first, filtered by customer, status and the date the sale was rung up.

    Args:
        customer_id: Only this customer's sales.
        status: Only sales in this status.
        date_from: First date included (YYYY-MM-DD).
        date_to: Last date included (YYYY-MM-DD).
        limit: Maximum number of sales to return (1-200).
    """
    d1 = _date(date_from, "date_from") if date_from else None
    d2 = _date(date_to, "date_to") if date_to else None
    return db.query(
        "SELECT s.id, s.customer_id, c.first_name || ' ' || c.last_name AS customer_name, s.staff_id, s.status, "
        "s.payment_method, s.created_at, s.total, (SELECT count(*) FROM sale_items si WHERE si.sale_id = s.id) AS item_lines "
        "FROM sales s LEFT JOIN customers c ON c.id = s.customer_id "
        "WHERE (%s::int IS NULL OR s.customer_id = %s::int) AND (%s::text IS NULL OR s.status = %s::text) "
        "AND (%s::date IS NULL OR s.created_at::date >= %s::date) AND (%s::date IS NULL OR s.created_at::date <= %s::date) "
        "ORDER BY s.created_at DESC, s.id DESC LIMIT %s",
        customer_id, customer_id, status, status, d1, d1, d2, d2, _limit(limit),
    )


# --------------------------------------------------------------------------- workshop


def list_service_types(db) -> list[dict]:
    """List the workshop's services with their base labor price and estimated time."""
    return db.query("SELECT * FROM service_types ORDER BY id")


def list_staff(db, role: Literal["manager", "sales", "mechanic"] | None = None, include_inactive: bool = False) -> list[dict]:
    """List shop staff.

    Args:
        role: Only staff with this role.
        include_inactive: Also list former staff.
    """
    return db.query(
        "SELECT id, full_name, role, email, active FROM staff WHERE (%s::text IS NULL OR role = %s::text) "
        "AND (%s OR active) ORDER BY id",
        role, role, include_inactive,
    )


def create_repair_order(db, bike_id: int, service_type_id: int, due_date: str, notes: str | None = None) -> dict:
    """Check a customer's bike into the workshop. A bike can have only one open repair order at a time.

    The labor price is the service's base price; the order starts unassigned in status 'received'.

    Args:
        bike_id: The registered bike.
        service_type_id: The service to perform (see list_service_types).
        due_date: Promised ready date (YYYY-MM-DD).
        notes: What the customer reported.
    """
    bike = db.one("SELECT * FROM bikes WHERE id = %s", bike_id)
    if bike is None:
        raise ToolError(f"bike {bike_id} not found")
    service = db.one("SELECT * FROM service_types WHERE id = %s", service_type_id)
    if service is None:
        raise ToolError(f"service type {service_type_id} not found")
    due = _date(due_date, "due_date")
    if service["code"] == "EBIKE-DIAG" and bike["bike_type"] != "e-bike":
        raise ToolError("the e-bike diagnostic can only be booked for e-bikes")
    busy = db.one(
        "SELECT id, status FROM repair_orders WHERE bike_id = %s AND status IN ('received', 'in_progress', 'waiting_parts', 'completed')",
        bike_id,
    )
    if busy:
        raise ToolError(f"bike {bike_id} already has repair order {busy['id']} ({busy['status']})")
    row = db.one(
        "INSERT INTO repair_orders (bike_id, service_type_id, mechanic_id, status, labor_price, notes, dropped_off_at, due_date) "
        "VALUES (%s, %s, NULL, 'received', %s, %s, now(), %s) RETURNING id",
        bike_id, service_type_id, service["base_price"], notes, due,
    )
    return _repair_detail(db, row["id"])


def get_repair_order(db, repair_order_id: int) -> dict:
    """Get one repair order with bike, customer, mechanic, parts used and the bill (labor + parts).

    Args:
        repair_order_id: The repair order id.
    """
    return _repair_detail(db, repair_order_id)


def list_repair_orders(
    db,
    status: Literal["received", "in_progress", "waiting_parts", "completed", "picked_up", "cancelled", "open"] | None = None,
    mechanic_id: int | None = None,
    customer_id: int | None = None,
    bike_id: int | None = None,
    limit: int = 50,
) -> list[dict]:
    """List repair orders, newest first. Status 'open' means received, in_progress or waiting_parts.

    Args:
        status: Only orders in this status ('open' = not yet completed, picked up or cancelled).
        mechanic_id: Only orders assigned to this mechanic.
        customer_id: Only orders for bikes of this customer.
        bike_id: Only orders for this bike.
        limit: Maximum number of orders to return (1-200).
    """
    statuses = list(OPEN_REPAIR_STATUSES) if status == "open" else ([status] if status else None)
    return db.query(
        "SELECT r.id, r.status, r.bike_id, b.brand || ' ' || b.model AS bike, b.customer_id, "
        "c.first_name || ' ' || c.last_name AS customer_name, st.code AS service_code, r.mechanic_id, "
        "m.full_name AS mechanic_name, r.dropped_off_at, r.due_date, r.labor_price "
        "FROM repair_orders r JOIN bikes b ON b.id = r.bike_id JOIN customers c ON c.id = b.customer_id "
        "JOIN service_types st ON st.id = r.service_type_id LEFT JOIN staff m ON m.id = r.mechanic_id "
        "WHERE (%s::text[] IS NULL OR r.status = ANY(%s::text[])) AND (%s::int IS NULL OR r.mechanic_id = %s::int) "
        "AND (%s::int IS NULL OR b.customer_id = %s::int) AND (%s::int IS NULL OR r.bike_id = %s::int) "
        "ORDER BY r.dropped_off_at DESC, r.id DESC LIMIT %s",
        statuses, statuses, mechanic_id, mechanic_id, customer_id, customer_id, bike_id, bike_id, _limit(limit),
    )


def assign_mechanic(db, repair_order_id: int, staff_id: int) -> dict:
    """Assign (or reassign) an open repair order to an active mechanic.

    Args:
        repair_order_id: The repair order.
        staff_id: The mechanic's staff id.
    """
    ro = _repair(db, repair_order_id)
    if ro["status"] not in OPEN_REPAIR_STATUSES:
        raise ToolError(f"repair order {repair_order_id} is {ro['status']}; only open orders can be assigned")
    staff = db.one("SELECT * FROM staff WHERE id = %s", staff_id)
    if staff is None:
        raise ToolError(f"staff member {staff_id} not found")
    if staff["role"] != "mechanic":
        raise ToolError(f"{staff['full_name']} is not a mechanic")
    if not staff["active"]:
        raise ToolError(f"{staff['full_name']} no longer works here")
    if ro["mechanic_id"] == staff_id:
        raise ToolError(f"repair order {repair_order_id} is already assigned to {staff['full_name']}")
    db.execute("UPDATE repair_orders SET mechanic_id = %s WHERE id = %s", staff_id, repair_order_id)
    return _repair_detail(db, repair_order_id)


def update_repair_status(
    db, repair_order_id: int, new_status: Literal["in_progress", "waiting_parts", "completed", "picked_up"]
) -> dict:
    """Move a repair order along the workflow.

    Allowed: received -> in_progress; in_progress -> waiting_parts or completed; waiting_parts -> in_progress;
    completed -> picked_up. Work can only start once a mechanic is assigned. Use cancel_repair_order to cancel.

    Args:
        repair_order_id: The repair order.
        new_status: The status to move to.
    """
    ro = _repair(db, repair_order_id)
    if new_status not in REPAIR_TRANSITIONS[ro["status"]]:
        allowed = ", ".join(REPAIR_TRANSITIONS[ro["status"]]) or "none"
        raise ToolError(f"cannot move repair order {repair_order_id} from {ro['status']} to {new_status} (allowed: {allowed})")
    if new_status in ("in_progress", "completed") and ro["mechanic_id"] is None:
        raise ToolError(f"repair order {repair_order_id} has no mechanic assigned")
    if new_status == "completed":
        db.execute("UPDATE repair_orders SET status = 'completed', completed_at = now() WHERE id = %s", repair_order_id)
    elif new_status == "picked_up":
        db.execute("UPDATE repair_orders SET status = 'picked_up', picked_up_at = now() WHERE id = %s", repair_order_id)
    else:
        db.execute("UPDATE repair_orders SET status = %s WHERE id = %s", new_status, repair_order_id)
    return _repair_detail(db, repair_order_id)


def add_repair_part(db, repair_order_id: int, sku: str, quantity: int = 1) -> dict:
    """Record a part fitted during an open repair; it is taken out of stock and billed at its current price.

    Args:
        repair_order_id: The open repair order.
        sku: SKU of the part.
        quantity: Number of units (at least 1, no more than in stock).
    """
    ro = _repair(db, repair_order_id)
    if ro["status"] not in OPEN_REPAIR_STATUSES:
        raise ToolError(f"repair order {repair_order_id} is {ro['status']}; parts can only be added to open orders")
    if quantity < 1:
        raise ToolError("quantity must be at least 1")
    product = _product_by_sku(db, sku)
    if product["category_id"] == 1:
        raise ToolError("complete bikes cannot be used as repair parts")
    if quantity > product["stock_qty"]:
        raise ToolError(f"only {product['stock_qty']} units of {product['sku']} in stock")
    db.execute("UPDATE products SET stock_qty = stock_qty - %s WHERE id = %s", quantity, product["id"])
    db.execute(
        "INSERT INTO repair_parts (repair_order_id, product_id, quantity, unit_price) VALUES (%s, %s, %s, %s)",
        repair_order_id, product["id"], quantity, product["price"],
    )
    return _repair_detail(db, repair_order_id)


def cancel_repair_order(db, repair_order_id: int, reason: str) -> dict:
    """Cancel an open repair order; any parts recorded on it go back into stock.

    Args:
        repair_order_id: The open repair order.
        reason: Why it is cancelled.
    """
    ro = _repair(db, repair_order_id)
    if ro["status"] not in OPEN_REPAIR_STATUSES:
        raise ToolError(f"repair order {repair_order_id} is {ro['status']} and cannot be cancelled")
    if not reason.strip():
        raise ToolError("a cancellation reason is required")
    for part in db.query("SELECT product_id, quantity FROM repair_parts WHERE repair_order_id = %s", repair_order_id):
        db.execute("UPDATE products SET stock_qty = stock_qty + %s WHERE id = %s", part["quantity"], part["product_id"])
    db.execute("DELETE FROM repair_parts WHERE repair_order_id = %s", repair_order_id)
    db.execute(
        "UPDATE repair_orders SET status = 'cancelled', cancel_reason = %s WHERE id = %s", reason.strip(), repair_order_id
    )
    return _repair_detail(db, repair_order_id)


# --------------------------------------------------------------------------- purchasing


def list_suppliers(db) -> list[dict]:
    """List suppliers with contact details and delivery lead time."""
    return db.query(
        "SELECT s.*, (SELECT count(*) FROM products p WHERE p.supplier_id = s.id AND p.active) AS active_products "
        "FROM suppliers s ORDER BY s.id"
    )


def list_purchase_orders(
    db,
    status: Literal["draft", "ordered", "received", "cancelled"] | None = None,
    supplier_id: int | None = None,
    limit: int = 50,
) -> list[dict]:
    """List purchase orders to suppliers, newest first.

    Args:
        status: Only orders in this status.
        supplier_id: Only orders to this supplier.
        limit: Maximum number of orders to return (1-200).
    """
    return db.query(
        "SELECT po.id, po.supplier_id, s.name AS supplier_name, po.status, po.created_at, po.ordered_at, po.received_at, "
        "(SELECT COALESCE(SUM(quantity * unit_cost), 0) FROM purchase_order_items i WHERE i.purchase_order_id = po.id) AS total_cost "
        "FROM purchase_orders po JOIN suppliers s ON s.id = po.supplier_id "
        "WHERE (%s::text IS NULL OR po.status = %s::text) AND (%s::int IS NULL OR po.supplier_id = %s::int) "
        "ORDER BY po.created_at DESC, po.id DESC LIMIT %s",
        status, status, supplier_id, supplier_id, _limit(limit),
    )


def get_purchase_order(db, purchase_order_id: int) -> dict:
    """Get one purchase order with its lines and total cost.

    Args:
        purchase_order_id: The purchase order id.
    """
    return _po_detail(db, purchase_order_id)


def create_purchase_order(db, supplier_id: int, notes: str | None = None) -> dict:
    """Start a draft purchase order to a supplier (created by you, Maya Lin).

    Args:
        supplier_id: The supplier.
        notes: Free-text notes.
    """
    if db.one("SELECT id FROM suppliers WHERE id = %s", supplier_id) is None:
        raise ToolError(f"supplier {supplier_id} not found")
    row = db.one(
        "INSERT INTO purchase_orders (supplier_id, created_by, status, notes, created_at) "
        "VALUES (%s, %s, 'draft', %s, now()) RETURNING id",
        supplier_id, ACTING_STAFF_ID, notes,
    )
    return _po_detail(db, row["id"])


def add_purchase_order_item(
    db, purchase_order_id: int, sku: str, quantity: int, unit_cost: float | None = None
) -> dict:
    """Add a product line to a draft purchase order. The product must come from that order's supplier.

    Args:
        purchase_order_id: The draft purchase order.
        sku: Product SKU.
        quantity: Units to order (at least 1).
        unit_cost: Agreed cost per unit; defaults to the product's current cost.
    """
    po = _purchase_order(db, purchase_order_id)
    if po["status"] != "draft":
        raise ToolError(f"purchase order {purchase_order_id} is {po['status']}; lines can only be added to drafts")
    if quantity < 1:
        raise ToolError("quantity must be at least 1")
    product = _product_by_sku(db, sku)
    if not product["active"]:
        raise ToolError(f"product {product['sku']} is discontinued and cannot be reordered")
    if product["supplier_id"] != po["supplier_id"]:
        raise ToolError(f"{product['sku']} is not supplied by this order's supplier (supplier {product['supplier_id']})")
    if unit_cost is not None and unit_cost < 0:
        raise ToolError("unit_cost cannot be negative")
    if db.one("SELECT id FROM purchase_order_items WHERE purchase_order_id = %s AND product_id = %s",
              purchase_order_id, product["id"]):
        raise ToolError(f"{product['sku']} is already on purchase order {purchase_order_id}")
    db.execute(
        "INSERT INTO purchase_order_items (purchase_order_id, product_id, quantity, unit_cost) "
        "VALUES (%s, %s, %s, round(%s::numeric, 2))",
        purchase_order_id, product["id"], quantity, unit_cost if unit_cost is not None else product["cost"],
    )
    return _po_detail(db, purchase_order_id)


def submit_purchase_order(db, purchase_order_id: int) -> dict:
    """Send a draft purchase order to the supplier (draft -> ordered). It needs at least one line.

    Args:
        purchase_order_id: The draft purchase order.
    """
    po = _purchase_order(db, purchase_order_id)
    if po["status"] != "draft":
        raise ToolError(f"purchase order {purchase_order_id} is {po['status']}, not draft")
    if not db.scalar("SELECT count(*) FROM purchase_order_items WHERE purchase_order_id = %s", purchase_order_id):
        raise ToolError(f"purchase order {purchase_order_id} has no lines")
    db.execute("UPDATE purchase_orders SET status = 'ordered', ordered_at = now() WHERE id = %s", purchase_order_id)
    return _po_detail(db, purchase_order_id)


def receive_purchase_order(db, purchase_order_id: int) -> dict:
    """Book the delivery of an ordered purchase order: every line's quantity is added to stock.

    Args:
        purchase_order_id: The ordered purchase order.
    """
    po = _purchase_order(db, purchase_order_id)
    if po["status"] != "ordered":
        raise ToolError(f"purchase order {purchase_order_id} is {po['status']}; only ordered purchase orders can be received")
    for line in db.query("SELECT product_id, quantity FROM purchase_order_items WHERE purchase_order_id = %s", purchase_order_id):
        db.execute("UPDATE products SET stock_qty = stock_qty + %s WHERE id = %s", line["quantity"], line["product_id"])
    db.execute("UPDATE purchase_orders SET status = 'received', received_at = now() WHERE id = %s", purchase_order_id)
    return _po_detail(db, purchase_order_id)


def cancel_purchase_order(db, purchase_order_id: int, reason: str) -> dict:
    """Cancel a draft or ordered purchase order.

    Args:
        purchase_order_id: The purchase order.
        reason: Why it is cancelled (stored in the notes).
    """
    po = _purchase_order(db, purchase_order_id)
    if po["status"] not in ("draft", "ordered"):
        raise ToolError(f"purchase order {purchase_order_id} is {po['status']} and cannot be cancelled")
    if not reason.strip():
        raise ToolError("a cancellation reason is required")
    db.execute("UPDATE purchase_orders SET status = 'cancelled', notes = %s WHERE id = %s", reason.strip(), purchase_order_id)
    return _po_detail(db, purchase_order_id)
