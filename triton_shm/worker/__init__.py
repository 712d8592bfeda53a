"""Worker processes that host model instances, and the front-end side that supervises them."""
