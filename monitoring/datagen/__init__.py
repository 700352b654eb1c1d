"""Synthetic history for load and page-cost benchmarks: users, chats, turns with stats, rig samples, audit rows.

Written with PostgreSQL's COPY (``rigdash_generate``); never used by the product itself."""
