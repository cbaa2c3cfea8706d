"""The files graphaudit makes: its temporary folder (`scratch`), outputs written without following
links into an input (`write`), and what a refused path is, in words (`path_kinds`)."""
