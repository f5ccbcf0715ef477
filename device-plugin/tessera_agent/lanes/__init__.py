"""Lanes and their coordination: the HP/BE lane book, the BE feedback loop and its pod restarts, the lane
coordinator and progress sockets, and the peer check that maps a socket's caller to its pod."""
