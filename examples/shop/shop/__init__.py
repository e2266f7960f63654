"""A shop that takes orders, charges them and mails receipts, with trioq doing the work."""
