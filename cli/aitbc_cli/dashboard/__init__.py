"""``aitbc dashboard``: a local web page over the state the CLI's views read (issue #31).

``state`` reads the home (cost is the snapshot's), ``app`` is the Starlette app, ``command`` the CLI."""
