# Active Record on the pg gem (Debian's packages) at its defaults through Weir in
# transaction mode: prepared_statements: true (each query with binds a named statement
# a1, a2..., cached per connection), advisory_locks: true (migrations hold a session
# advisory lock on a connection of their own), SETs at connect (client_min_messages,
# intervalstyle, timezone), a connection pool of 5.
#
# ActiveRecord::Schema.define makes the tables, then two migrations run as `rails
# db:migrate` runs them (MigrationContext); WEIR_CLIENTS threads share the pool; the
# driver matrix (tests/driver_matrix.rs) checks what PostgreSQL stored.
require "active_record"

CLIENTS = Integer(ENV.fetch("WEIR_CLIENTS", "10"))

# Raises: in a thread it is collected with the others' errors; in the main thread it ends
# the program with status 1.
def check(cond, what)
  raise "FAILED: #{what}" unless cond
end

ActiveRecord::Base.establish_connection(
  adapter: "postgresql",
  host: ENV.fetch("WEIR_HOST"),
  port: Integer(ENV.fetch("WEIR_PORT")),
  database: ENV.fetch("WEIR_DB"),
  username: ENV.fetch("WEIR_USER")
)

ActiveRecord::Schema.define(version: 1) do
  create_table :ar_accounts do |t|
    t.string :name, null: false, index: { unique: true }
    t.integer :balance, null: false, default: 0
  end
  create_table :ar_entries do |t|
    t.references :account, null: false, foreign_key: { to_table: :ar_accounts }
    t.integer :amount, null: false
  end
  create_table :ar_counters do |t|
    t.integer :value, null: false, default: 0
  end
end

ActiveRecord::MigrationContext.new(File.join(__dir__, "migrate"), ActiveRecord::SchemaMigration).migrate

class Account < ActiveRecord::Base
  self.table_name = "ar_accounts"
  has_many :entries
end

class Entry < ActiveRecord::Base
  self.table_name = "ar_entries"
  belongs_to :account
end

class Counter < ActiveRecord::Base
  self.table_name = "ar_counters"
end

def work(i)
  conn = ActiveRecord::Base.connection
  # Set at connect, on whichever server the connection was lent then.
  check(conn.select_value("show intervalstyle") == "iso_8601", "client #{i}: intervalstyle")
  check(conn.select_value("show client_min_messages") == "warning", "client #{i}: client_min_messages")

  acct = Account.create!(name: "acct-#{i}")
  Entry.insert_all((1..50).map { |k| { account_id: acct.id, amount: k, note: "bulk-#{k}" } })
  check(Entry.where(account_id: acct.id).count == 50, "client #{i}: insert_all")
  sum = Entry.where(account_id: acct.id).sum(:amount)
  check(sum == 1275, "client #{i}: sum #{sum}")
  Account.where(id: acct.id).update_all(["balance = balance + ?", sum])

  # Savepoints (requires_new): one undone by the program, one by PostgreSQL's unique
  # violation; the transaction goes on and commits.
  ActiveRecord::Base.transaction do
    Entry.create!(account: acct, amount: 1000, note: "outer")
    ActiveRecord::Base.transaction(requires_new: true) do
      Entry.create!(account: acct, amount: 5000, note: "inner-lost")
      raise ActiveRecord::Rollback
    end
    begin
      ActiveRecord::Base.transaction(requires_new: true) do
        Account.create!(name: "acct-#{i}")
      end
      check(false, "client #{i}: duplicate name accepted")
    rescue ActiveRecord::RecordNotUnique
      nil
    end
    Entry.create!(account: acct, amount: 2000, note: "after-savepoint")
  end

  # A whole transaction rolled back.
  ActiveRecord::Base.transaction do
    Account.where(id: acct.id).update_all(balance: -1)
    Entry.create!(account: acct, amount: 7000, note: "lost")
    raise ActiveRecord::Rollback
  end
  check(acct.reload.balance == 1275, "client #{i}: balance #{acct.balance} after the rollback")

  # SELECT ... FOR UPDATE on one row that every thread increments.
  5.times do
    ActiveRecord::Base.transaction do
      c = Counter.lock.find(1)
      c.update!(value: c.value + 1)
    end
  end

  # The same query with binds again and again: Active Record's named statement.
  8.times do |k|
    n = Entry.where(account_id: acct.id, amount: k..).count
    check(n == 52 - [k - 1, 0].max, "client #{i}: count #{n} for amount >= #{k}")
  end
  # Active Record's own pool of the statements it prepared (not public API).
  statements = conn.instance_variable_get(:@statements)
  check(statements.length.positive?, "client #{i}: no prepared statement")
end

errors = Queue.new
threads = (0...CLIENTS).map do |i|
  Thread.new do
    ActiveRecord::Base.connection_pool.with_connection { work(i) }
  rescue StandardError => e
    errors << "client #{i}: #{e.class}: #{e.message}"
  end
end
threads.each(&:join)
failed = []
failed << errors.pop until errors.empty?
failed.each { |e| puts e }
check(failed.empty?, "#{failed.length} client(s) failed")
check(Counter.find(1).value == 5 * CLIENTS, "counter #{Counter.find(1).value}")
puts "Active Record #{ActiveRecord::VERSION::STRING} on pg #{PG::VERSION} (Ruby #{RUBY_VERSION}): #{CLIENTS} clients ok"
