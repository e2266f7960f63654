"""The shop's own tables (a real app would use its migration tool)."""

SCHEMA = """
CREATE TABLE orders (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer  text    NOT NULL,
    sku       text    NOT NULL,
    cents     integer NOT NULL CHECK (cents > 0),
    status    text    NOT NULL DEFAULT 'new'
);
CREATE TABLE stock (sku text PRIMARY KEY, units integer NOT NULL CHECK (units >= 0));
CREATE TABLE receipts (order_id bigint PRIMARY KEY REFERENCES orders, job_id bigint NOT NULL);
"""
