"""Subscriptions in the schema: the Subscription root type, the fields every watch shares, entities and
rankings followed live.
"""
