from django.db import models


class Account(models.Model):
    name = models.CharField(max_length=50, unique=True)
    balance = models.IntegerField(default=0)


class Entry(models.Model):
    account = models.ForeignKey(Account, on_delete=models.CASCADE, related_name="entries")
    amount = models.IntegerField()
    note = models.CharField(max_length=50, default="")


class Counter(models.Model):
    id = models.IntegerField(primary_key=True)
    value = models.IntegerField(default=0)
