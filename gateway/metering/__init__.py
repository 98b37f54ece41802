"""Who is calling and what they may do: virtual keys, teams, the request's principal."""
