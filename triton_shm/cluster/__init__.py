"""Several front-end processes as one server (``--frontend-processes N``): each process is a
whole front-end that owns a share of the model instances, and the processes talk over peer
links (``peers``: Unix stream sockets carrying ``wire`` frames, never pickles) to forward a
request to the process that owns its model (``forwarding``) and to apply control operations
everywhere before they are answered. docs/design/frontend-processes.md has the design.
"""
