"""adbill web: the admin UI for advertisers, finance and admins (see README.md)."""
