"""The contracts room (P1-P3): contracts, principals, missions and authority.

:mod:`~charter.contracts.contract` parses and checks a contract (pure),
:mod:`~charter.contracts.amendments` says what right each change to one needs,
:mod:`~charter.contracts.principals` names who acts and with which rights,
:mod:`~charter.contracts.model` holds the mission record,
:mod:`~charter.contracts.missions` keeps missions and their versioned
contracts, and :mod:`~charter.contracts.authority` is the one place a
decision by a person is authorised. :mod:`~charter.contracts.store` owns the
``missions`` and ``contract_versions`` tables: every statement on them is there.
"""
