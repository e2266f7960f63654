"""The text of every statement, by domain; `trioq._db.statements` composes them."""
