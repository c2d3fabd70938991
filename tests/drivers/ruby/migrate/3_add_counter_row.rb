class AddCounterRow < ActiveRecord::Migration[6.1]
  def up
    execute "insert into ar_counters (id, value) values (1, 0)"
  end

  def down
    execute "delete from ar_counters where id = 1"
  end
end
