"""Moved to tests.support.apps; bench/ still imports this path (drop this file once bench/ imports tests.support)."""

from tests.support.apps import SHOP_TOPIC, SHOP_TYPES, START_MS, fill_shop, iso, shop_app

__all__ = ["SHOP_TOPIC", "SHOP_TYPES", "START_MS", "fill_shop", "iso", "shop_app"]
