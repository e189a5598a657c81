"""Entities in the schema: the entity object types composing stores that share a key, their pages,
relations between entities, and the batches that read a store once per set of entities.
"""
