-- The shop's table (a real app would keep it in its migration tool): `psql -f schema.sql`.
CREATE TABLE orders (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    total_cents integer NOT NULL CHECK (total_cents > 0),
    receipt_job bigint  -- the trioq job that sent the receipt (tasks.py)
);
