"""The ``echo`` protocol: a third party's plugin built on b2bhub's public plugin API."""
