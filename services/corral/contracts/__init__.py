"""What two sides share (the gateway, the controller, the proxy, the client): request signing and
proofs, CDP rules, addresses the browser may open, secret placeholders, actors, frame limits, the
egress proxy's control messages.

The bottom of the house: standard library only, and nothing else of corral (a test holds that),
so the egress image and a client install carry it whole."""
