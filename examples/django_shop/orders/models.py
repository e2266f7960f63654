from django.db import models


class Order(models.Model):
    total_cents = models.PositiveIntegerField()
    # The id of the trioq job that sent the receipt: set by orders/tasks.py, in SQL.
    receipt_job = models.BigIntegerField(null=True)

    class Meta:
        db_table = "orders"
