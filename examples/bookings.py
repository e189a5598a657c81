"""The bookings example (seed 001): hotel bookings keyed by customer on 9 partitions, cancellations as tombstones.

Topics: ``bookings`` — every booking made, keyed by customer (9 partitions); ``reservations`` — a table keyed
by booking id: a booking is written there when made and deleted by a tombstone when cancelled.

Questions it answers:
- the latest booking of a customer: ``latestBooking { get(key: "cust-0042") { hotel nights booking { hotel } } }``
  (``booking`` is a relation to the ``Booking`` entity: its fields are null once the booking is cancelled);
- the bookings of a customer within a time range: ``bookingsPerHour { fetch(key:, from:, to:) { start value } }``
  and ``nightsPerHour``;
- whether a booking still stands: ``booking(key: "b-1-17") { hotel nights }`` (null fields when cancelled);
- the latest booking at each hotel: ``latestAtHotel`` is keyed by the hotel column, so one hotel's bookings
  arrive on many partitions; its ``latest`` is the booking with the greatest event time over all of them.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from functools import partial

from iqgraph import (
    App,
    Entity,
    Event,
    KafkaSettings,
    Relation,
    Topic,
    count,
    iso_timestamp,
    key_value_store,
    latest,
    sum_,
    table_store,
    tumbling,
    window_store,
)

BOOKING_SCHEMA = "booking_id STRING, customer STRING, hotel STRING, nights INT, amount DOUBLE, ts TIMESTAMP"
CUSTOMERS = 400
HOTELS = [f"hotel-{n:02d}" for n in range(25)]
CANCEL_EVERY = 12  # about one booking in CANCEL_EVERY is cancelled a little later


def generate(
    seed: int, start_ms: int, bookings: str = "bookings", reservations: str = "reservations"
) -> Iterator[Event]:
    """Yield bookings forever (to both topics), and a cancellation (a tombstone) for some of them."""
    rng = random.Random(seed)
    now = start_ms
    pending: list[tuple[int, str]] = []  # (when to cancel, booking id)
    for i in range(1 << 62):
        now += rng.randint(10, 60)
        while pending and pending[0][0] <= i:
            yield reservations, pending.pop(0)[1], None
        customer = f"cust-{(int(rng.paretovariate(1.2)) - 1) % CUSTOMERS:04d}"
        nights = rng.randint(1, 7)
        booking_id = f"b-{seed}-{i}"
        booking = {
            "booking_id": booking_id,
            "customer": customer,
            "hotel": rng.choice(HOTELS),
            "nights": nights,
            "amount": round(nights * rng.uniform(60.0, 240.0), 2),
            "ts": iso_timestamp(now),
        }
        yield bookings, customer, booking
        yield reservations, booking_id, booking
        if rng.randrange(CANCEL_EVERY) == 0:
            pending.append((i + rng.randint(1, 20), booking_id))


def build_app(
    bookings: str = "bookings",
    reservations: str = "reservations",
    partitions: int = 9,
    kafka: KafkaSettings | None = None,
) -> App:
    """Return the bookings app on the given topics (tests give each run topics of their own)."""
    return App(
        name="bookings",
        description="Hotel bookings keyed by customer; reservations as a table whose tombstones are cancellations",
        topics=[
            Topic(bookings, schema=BOOKING_SCHEMA, event_time="ts", partitions=partitions),
            Topic(reservations, schema=BOOKING_SCHEMA, partitions=partitions, table=True),
        ],
        stores=[
            table_store(
                "reservations",
                reservations,
                "customer",
                "hotel",
                "nights",
                "amount",
                "ts",
                description="Bookings that stand, by booking id (a cancellation deletes one)",
            ),
            key_value_store(
                "latest_booking",
                bookings,
                latest(),
                description="Each customer's latest booking",
                relations=[Relation("booking", "Booking", column="booking_id")],
            ),
            key_value_store("booking_count", bookings, count(), description="Bookings per customer"),
            window_store("bookings_per_hour", bookings, count(), tumbling(minutes=60), description="Bookings per hour"),
            window_store(
                "nights_per_hour", bookings, sum_("nights"), tumbling(minutes=60), description="Nights booked per hour"
            ),
            key_value_store(
                "latest_at_hotel",
                bookings,
                latest("booking_id", "customer", "nights", "ts"),
                key="hotel",
                description="The latest booking at each hotel, by event time over every partition",
                relations=[Relation("booking", "Booking", column="booking_id")],
            ),
        ],
        entities=[
            Entity("Booking", stores=["reservations"], table="reservations", description="A booking that stands"),
            Entity(
                "BookingCustomer",
                stores=["latest_booking", "booking_count", "bookings_per_hour", "nights_per_hour"],
                plural="bookingCustomers",
                description="A customer's bookings",
            ),
        ],
        kafka=kafka or KafkaSettings(),
        generator=partial(generate, bookings=bookings, reservations=reservations),
    )


app = build_app()
