"""The rayft service end to end: a real `rayft serve` process on loopback, real gRPC, SQLite, and the session's
local Ray cluster through its Jobs API. Jobs are the tiny CPU preset (about 30 s each)."""
