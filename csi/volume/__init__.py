"""What a bundle volume is, shared by the Node and Controller services: its attributes
(``source``) and the access modes it honours (``access``).
"""
