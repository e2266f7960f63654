"""``POST /orders {"total_cents": 1250, "card": "..."}``: the order and its receipt job
commit together, or (a declined card) neither does."""

import json

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from trioq import producer

from .models import Order


class PaymentDeclined(Exception):
    pass


def charge(card: str, order: Order) -> None:
    """The payment provider (a stand-in): it declines the card called "declined"."""
    if card == "declined":
        raise PaymentDeclined(f"order {order.id}: card declined")


@require_POST
def create_order(request: HttpRequest) -> JsonResponse:
    form = json.loads(request.body)
    try:
        with transaction.atomic():
            order = Order.objects.create(total_cents=form["total_cents"])
            job = producer.enqueue(connection, "send_receipt", {"order_id": order.id})
            charge(form["card"], order)  # raises after the enqueue: the job rolls back too
    except PaymentDeclined:
        return JsonResponse({"error": "card declined"}, status=402)
    return JsonResponse({"order": order.id, "job": job.job_id}, status=201)
