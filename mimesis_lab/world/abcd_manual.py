"""The support manual of the world's store: ABCD ``kb.json`` and ``guidelines.json`` for 12 subflows.

A subset (7 flows, 12 subflows) of the project's hand-written ABCD manual, kept as data so the
world is self-contained. :class:`~mimesis_lab.judges.abcd_agent.ABCDSupportAgent` reads it (required
actions, what each needs, restrictive policy sentences), and so do the grounded behaviour kwargs
(:mod:`mimesis_lab.abcd`).
"""
from __future__ import annotations

# flake8: noqa: E501

FLOW_OF = {'recover_username': 'account_access',
 'recover_password': 'account_access',
 'reset_2fa': 'account_access',
 'manage_change_address': 'manage_account',
 'status_delivery_time': 'order_issue',
 'manage_cancel': 'order_issue',
 'refund_initiate': 'product_defect',
 'return_size': 'product_defect',
 'return_color': 'product_defect',
 'promo_code_invalid': 'purchase_dispute',
 'missing': 'shipping_issue',
 'manage_pay_bill': 'subscription_inquiry'}

KB = {'recover_username': ['pull-up-account', 'verify-identity'],
 'recover_password': ['pull-up-account', 'enter-details', 'make-password'],
 'reset_2fa': ['pull-up-account', 'enter-details', 'send-link'],
 'manage_change_address': ['pull-up-account', 'verify-identity', 'record-reason', 'update-account'],
 'status_delivery_time': ['pull-up-account', 'validate-purchase', 'shipping-status', 'ask-the-oracle',
                          'update-order'],
 'manage_cancel': ['pull-up-account', 'validate-purchase', 'shipping-status', 'record-reason', 'update-order'],
 'refund_initiate': ['pull-up-account', 'validate-purchase', 'record-reason', 'enter-details', 'offer-refund'],
 'return_size': ['pull-up-account', 'validate-purchase', 'membership', 'enter-details', 'update-order'],
 'return_color': ['pull-up-account', 'validate-purchase', 'membership', 'enter-details', 'update-order'],
 'promo_code_invalid': ['pull-up-account', 'validate-purchase', 'ask-the-oracle', 'promo-code'],
 'missing': ['pull-up-account', 'validate-purchase', 'record-reason', 'make-purchase'],
 'manage_pay_bill': ['pull-up-account', 'verify-identity', 'subscription-status', 'enter-details', 'update-account']}

GUIDELINES = {'Account Access': {'description': 'logging in: usernames, passwords and two-factor authentication',
                    'subflows': {'Recover Username': {'actions': [{'type': 'interaction',
                                                                   'button': 'Pull up Account',
                                                                   'text': "Start by asking for the customer's full "
                                                                           'name (first and last) and enter it with '
                                                                           '[Pull up Account]. This loads their '
                                                                           'account in the background.',
                                                                   'subtext': []},
                                                                  {'type': 'kb query',
                                                                   'button': 'Verify Identity',
                                                                   'text': 'Ask for three of the four items below '
                                                                           'and press [Verify Identity]:',
                                                                   'subtext': ['Full name', 'Zip code',
                                                                               'Phone number', 'Email address']},
                                                                  {'type': 'communication',
                                                                   'button': 'N/A',
                                                                   'text': 'Once verified, read the username back to '
                                                                           'the customer exactly as it is stored.',
                                                                   'subtext': ['The account username cannot be '
                                                                               'changed. If the customer wants a '
                                                                               'different username, they must open a '
                                                                               'new account.']}],
                                                      'instructions': ['Help the customer find their username.',
                                                                       'Policy: usernames are permanent. Do not '
                                                                       'promise a username change, not even for gold '
                                                                       'members.']},
                                 'Recover Password': {'actions': [{'type': 'interaction',
                                                                   'button': 'Pull up Account',
                                                                   'text': "Start by asking for the customer's full "
                                                                           'name (first and last) and enter it with '
                                                                           '[Pull up Account]. This loads their '
                                                                           'account in the background.',
                                                                   'subtext': []},
                                                                  {'type': 'interaction',
                                                                   'button': 'Enter Details',
                                                                   'text': 'Ask for the username (or the email on '
                                                                           'file) and enter it with [Enter Details].',
                                                                   'subtext': ['If they do not know their username, '
                                                                               'run Recover Username first']},
                                                                  {'type': 'communication',
                                                                   'button': 'N/A',
                                                                   'text': 'Explain that agents cannot see or read '
                                                                           "out the customer's current password; you "
                                                                           'will generate a new temporary one '
                                                                           'instead.',
                                                                   'subtext': []},
                                                                  {'type': 'kb query',
                                                                   'button': 'Make Password',
                                                                   'text': 'To run [Make Password] you need one of:',
                                                                   'subtext': ['The PIN number on the account',
                                                                               'The answer to the security '
                                                                               'question']}],
                                                      'instructions': ['Generate a new temporary password and share '
                                                                       'it with the customer.',
                                                                       'Policy: old passwords are never disclosed, '
                                                                       'and a new password is only generated after a '
                                                                       'PIN or security answer is given.']},
                                 'Reset Two-Factor Auth': {'actions': [{'type': 'interaction',
                                                                        'button': 'Pull up Account',
                                                                        'text': "Start by asking for the customer's "
                                                                                'full name (first and last) and '
                                                                                'enter it with [Pull up Account]. '
                                                                                'This loads their account in the '
                                                                                'background.',
                                                                        'subtext': []},
                                                                       {'type': 'interaction',
                                                                        'button': 'Enter Details',
                                                                        'text': 'Ask for the email address on the '
                                                                                'account and enter it with [Enter '
                                                                                'Details].',
                                                                        'subtext': ['If the email given does not '
                                                                                    'match the one on file, do not '
                                                                                    'continue; the link can only go '
                                                                                    'to the email on file']},
                                                                       {'type': 'interaction',
                                                                        'button': 'Send Link',
                                                                        'text': 'Press [Send Link] to email the '
                                                                                'reset link together with our '
                                                                                'account security best practices.',
                                                                        'subtext': ['Two-factor authentication can '
                                                                                    'only be reset by sending a link '
                                                                                    'to the email on file.',
                                                                                    'Never reset it over the phone, '
                                                                                    'by text message, or by sending '
                                                                                    'the link to a new email '
                                                                                    'address.']}],
                                                           'instructions': ['Tell the customer a reset link is being '
                                                                            'sent to their email, then follow the '
                                                                            'steps.',
                                                                            'Policy: two-factor authentication can '
                                                                            'only be reset by sending a link to the '
                                                                            'email on file.']}}},
 'Manage Account': {'description': 'changing profile details and questions about account credit',
                    'subflows': {'Manage Change Address': {'actions': [{'type': 'interaction',
                                                                        'button': 'Pull up Account',
                                                                        'text': "Start by asking for the customer's "
                                                                                'full name (first and last) and '
                                                                                'enter it with [Pull up Account]. '
                                                                                'This loads their account in the '
                                                                                'background.',
                                                                        'subtext': []},
                                                                       {'type': 'kb query',
                                                                        'button': 'Verify Identity',
                                                                        'text': "Verify the customer's identity with "
                                                                                '[Verify Identity] using their full '
                                                                                'name plus two of the following:',
                                                                        'subtext': ['Zip code',
                                                                                    'Phone number on file',
                                                                                    'Email address on file',
                                                                                    'Never reveal account '
                                                                                    'information before verification '
                                                                                    'succeeds']},
                                                                       {'type': 'interaction',
                                                                        'button': 'Record Reason',
                                                                        'text': 'Ask why the customer is changing '
                                                                                'the address and record it with '
                                                                                '[Record Reason].',
                                                                        'subtext': []},
                                                                       {'type': 'interaction',
                                                                        'button': 'Update Account',
                                                                        'text': 'Enter the new street address with '
                                                                                '[Update Account].',
                                                                        'subtext': ['Only the address on the account '
                                                                                    'is updated; orders that have '
                                                                                    'already shipped keep their '
                                                                                    'original address',
                                                                                    'The account username cannot be '
                                                                                    'changed as part of this or any '
                                                                                    'other flow']}],
                                                           'instructions': ["Update the customer's address after "
                                                                            'verifying their identity.',
                                                                            'Policy: the account username cannot be '
                                                                            'changed; only address, phone and '
                                                                            'payment details can be edited.']}}},
 'Order Issue': {'description': 'questions and changes to an order that has been placed',
                 'subflows': {'Status Delivery Time': {'actions': [{'type': 'interaction',
                                                                    'button': 'Pull up Account',
                                                                    'text': "Start by asking for the customer's full "
                                                                            'name (first and last) and enter it with '
                                                                            '[Pull up Account]. This loads their '
                                                                            'account in the background.',
                                                                    'subtext': []},
                                                                   {'type': 'kb query',
                                                                    'button': 'Validate Purchase',
                                                                    'text': 'Confirm the purchase is real with '
                                                                            '[Validate Purchase]. You need all three '
                                                                            'of:',
                                                                    'subtext': ['Username - if the customer does not '
                                                                                'remember it, run the Recover '
                                                                                'Username subflow first',
                                                                                'Email address',
                                                                                'Order ID - a 10-digit number found '
                                                                                'in the confirmation email or on the '
                                                                                'receipt']},
                                                                   {'type': 'interaction',
                                                                    'button': 'Shipping Status',
                                                                    'text': 'Record the current shipping status with '
                                                                            '[Shipping Status]: order received, in '
                                                                            'transit, out for delivery or delivered.',
                                                                    'subtext': []},
                                                                   {'type': 'kb query',
                                                                    'button': 'Ask the Oracle',
                                                                    'text': 'Use [Ask the Oracle] to check the '
                                                                            'expected delivery date.',
                                                                    'subtext': []},
                                                                   {'type': 'interaction',
                                                                    'button': 'Update Order',
                                                                    'text': 'If the order is past the delivery '
                                                                            'window, upgrade it with [Update Order] '
                                                                            'to next day shipping at no charge.',
                                                                    'subtext': ['Orders normally arrive within 7 '
                                                                                'business days after purchase',
                                                                                'Only orders past this window are '
                                                                                'upgraded for free']}],
                                                       'instructions': ['Tell the customer when their order will '
                                                                        'arrive.',
                                                                        'Policy: free next-day upgrades are only '
                                                                        'given to orders that are past the 7 '
                                                                        'business day delivery window.']},
                              'Manage Cancel': {'actions': [{'type': 'interaction',
                                                             'button': 'Pull up Account',
                                                             'text': "Start by asking for the customer's full name "
                                                                     '(first and last) and enter it with [Pull up '
                                                                     'Account]. This loads their account in the '
                                                                     'background.',
                                                             'subtext': []},
                                                            {'type': 'kb query',
                                                             'button': 'Validate Purchase',
                                                             'text': 'Confirm the purchase is real with [Validate '
                                                                     'Purchase]. You need all three of:',
                                                             'subtext': ['Username - if the customer does not '
                                                                         'remember it, run the Recover Username '
                                                                         'subflow first',
                                                                         'Email address',
                                                                         'Order ID - a 10-digit number found in the '
                                                                         'confirmation email or on the receipt']},
                                                            {'type': 'interaction',
                                                             'button': 'Shipping Status',
                                                             'text': 'Check the status with [Shipping Status].',
                                                             'subtext': ['Orders can only be cancelled while their '
                                                                         "status is 'order received'",
                                                                         'Once an order is in transit, out for '
                                                                         'delivery or delivered it cannot be '
                                                                         'cancelled; the customer must wait for '
                                                                         'delivery and start a return',
                                                                         'If the order has already shipped, its '
                                                                         'delivery date and address cannot be '
                                                                         'changed either']},
                                                            {'type': 'interaction',
                                                             'button': 'Record Reason',
                                                             'text': 'Record the reason for cancelling with [Record '
                                                                     'Reason].',
                                                             'subtext': []},
                                                            {'type': 'interaction',
                                                             'button': 'Update Order',
                                                             'text': 'Cancel the order with [Update Order] (cancel '
                                                                     'order). The refund goes back to the original '
                                                                     'payment method.',
                                                             'subtext': []}],
                                                'instructions': ['Cancel orders that have not shipped yet.',
                                                                 'Policy: orders that have already shipped cannot be '
                                                                 'cancelled.']}}},
 'Product Defect': {'description': 'refunds and returns of items the customer has received',
                    'subflows': {'Initiate Refund': {'actions': [{'type': 'interaction',
                                                                  'button': 'Pull up Account',
                                                                  'text': "Start by asking for the customer's full "
                                                                          'name (first and last) and enter it with '
                                                                          '[Pull up Account]. This loads their '
                                                                          'account in the background.',
                                                                  'subtext': []},
                                                                 {'type': 'kb query',
                                                                  'button': 'Validate Purchase',
                                                                  'text': 'Confirm the purchase is real with '
                                                                          '[Validate Purchase]. You need all three '
                                                                          'of:',
                                                                  'subtext': ['Username - if the customer does not '
                                                                              'remember it, run the Recover Username '
                                                                              'subflow first',
                                                                              'Email address',
                                                                              'Order ID - a 10-digit number found in '
                                                                              'the confirmation email or on the '
                                                                              'receipt']},
                                                                 {'type': 'interaction',
                                                                  'button': 'Record Reason',
                                                                  'text': 'Ask why the customer wants a refund and '
                                                                          'record it with [Record Reason].',
                                                                  'subtext': []},
                                                                 {'type': 'interaction',
                                                                  'button': 'Enter Details',
                                                                  'text': 'Enter the account ID with [Enter Details] '
                                                                          'so the refund reaches the payment method '
                                                                          'on file.',
                                                                  'subtext': []},
                                                                 {'type': 'interaction',
                                                                  'button': 'Offer Refund',
                                                                  'text': 'Enter the refund amount (without the '
                                                                          'dollar sign) and press [Offer Refund].',
                                                                  'subtext': ['Refunds are issued only to the '
                                                                              'original payment method; paper checks '
                                                                              'and transfers to other accounts are '
                                                                              'not available',
                                                                              'Orders paid with a gift card are '
                                                                              'refunded as account value',
                                                                              'The refund can never exceed the price '
                                                                              'paid for the item']}],
                                                     'instructions': ['Process refunds for defective items.',
                                                                      'Policy: refunds are issued only to the '
                                                                      'original payment method.']},
                                 'Return Due to Size': {'actions': [{'type': 'interaction',
                                                                     'button': 'Pull up Account',
                                                                     'text': "Start by asking for the customer's "
                                                                             'full name (first and last) and enter '
                                                                             'it with [Pull up Account]. This loads '
                                                                             'their account in the background.',
                                                                     'subtext': []},
                                                                    {'type': 'kb query',
                                                                     'button': 'Validate Purchase',
                                                                     'text': 'Confirm the purchase is real with '
                                                                             '[Validate Purchase]. You need all '
                                                                             'three of:',
                                                                     'subtext': ['Username - if the customer does '
                                                                                 'not remember it, run the Recover '
                                                                                 'Username subflow first',
                                                                                 'Email address',
                                                                                 'Order ID - a 10-digit number found '
                                                                                 'in the confirmation email or on '
                                                                                 'the receipt']},
                                                                    {'type': 'faq/policy',
                                                                     'button': 'Membership Privileges',
                                                                     'text': "Ask for the customer's membership "
                                                                             'level (guest, bronze, silver or gold) '
                                                                             'and record it with [Membership '
                                                                             'Privileges].',
                                                                     'subtext': ['Gold: unlimited returns, free '
                                                                                 'shipping on every order, '
                                                                                 'unexpected fees waived',
                                                                                 'Silver: unexpected fees waived, '
                                                                                 'returns within 90 days',
                                                                                 'Bronze and guest: returns within '
                                                                                 '90 days, standard fees apply']},
                                                                    {'type': 'communication',
                                                                     'button': 'N/A',
                                                                     'text': 'Check the return window before going '
                                                                             'further:',
                                                                     'subtext': ['Only gold members have unlimited '
                                                                                 'returns',
                                                                                 'Returns are only accepted within '
                                                                                 '90 days of purchase for non-gold '
                                                                                 'members',
                                                                                 'If the purchase is outside the '
                                                                                 'window, politely decline; if the '
                                                                                 'customer insists, you may offer to '
                                                                                 'notify the manager, who can review '
                                                                                 'it']},
                                                                    {'type': 'interaction',
                                                                     'button': 'Enter Details',
                                                                     'text': 'Enter the full address where the '
                                                                             'return label should be sent with '
                                                                             '[Enter Details].',
                                                                     'subtext': []},
                                                                    {'type': 'interaction',
                                                                     'button': 'Update Order',
                                                                     'text': 'Record how the item comes back with '
                                                                             '[Update Order]: by mail, in store, or '
                                                                             'drop off center.',
                                                                     'subtext': ['The refund is issued to the '
                                                                                 'original payment method once the '
                                                                                 'item is received']}],
                                                        'instructions': ['Set up a return for an item that does not '
                                                                         'fit.',
                                                                         'Policy: returns are only accepted within '
                                                                         '90 days of purchase for non-gold '
                                                                         'members.']},
                                 'Return Due to Color': {'actions': [{'type': 'interaction',
                                                                      'button': 'Pull up Account',
                                                                      'text': "Start by asking for the customer's "
                                                                              'full name (first and last) and enter '
                                                                              'it with [Pull up Account]. This loads '
                                                                              'their account in the background.',
                                                                      'subtext': []},
                                                                     {'type': 'kb query',
                                                                      'button': 'Validate Purchase',
                                                                      'text': 'Confirm the purchase is real with '
                                                                              '[Validate Purchase]. You need all '
                                                                              'three of:',
                                                                      'subtext': ['Username - if the customer does '
                                                                                  'not remember it, run the Recover '
                                                                                  'Username subflow first',
                                                                                  'Email address',
                                                                                  'Order ID - a 10-digit number '
                                                                                  'found in the confirmation email '
                                                                                  'or on the receipt']},
                                                                     {'type': 'faq/policy',
                                                                      'button': 'Membership Privileges',
                                                                      'text': "Ask for the customer's membership "
                                                                              'level (guest, bronze, silver or gold) '
                                                                              'and record it with [Membership '
                                                                              'Privileges].',
                                                                      'subtext': ['Gold: unlimited returns, free '
                                                                                  'shipping on every order, '
                                                                                  'unexpected fees waived',
                                                                                  'Silver: unexpected fees waived, '
                                                                                  'returns within 90 days',
                                                                                  'Bronze and guest: returns within '
                                                                                  '90 days, standard fees apply']},
                                                                     {'type': 'communication',
                                                                      'button': 'N/A',
                                                                      'text': 'Check the return window:',
                                                                      'subtext': ['Only gold members have unlimited '
                                                                                  'returns',
                                                                                  'Returns are only accepted within '
                                                                                  '90 days of purchase for non-gold '
                                                                                  'members']},
                                                                     {'type': 'interaction',
                                                                      'button': 'Enter Details',
                                                                      'text': "Enter the customer's full address "
                                                                              'with [Enter Details].',
                                                                      'subtext': []},
                                                                     {'type': 'interaction',
                                                                      'button': 'Update Order',
                                                                      'text': 'Choose the return method with [Update '
                                                                              'Order]: by mail, in store, or drop '
                                                                              'off center.',
                                                                      'subtext': []}],
                                                         'instructions': ['Set up a return for an item whose color '
                                                                          'does not match the listing.',
                                                                          'Policy: items must be unworn with tags '
                                                                          'attached; the 90-day window applies to '
                                                                          'non-gold members.']}}},
 'Purchase Dispute': {'description': 'disagreements about prices, promotions and promo codes',
                      'subflows': {'Promo Code Invalid': {'actions': [{'type': 'interaction',
                                                                       'button': 'Pull up Account',
                                                                       'text': "Start by asking for the customer's "
                                                                               'full name (first and last) and enter '
                                                                               'it with [Pull up Account]. This '
                                                                               'loads their account in the '
                                                                               'background.',
                                                                       'subtext': []},
                                                                      {'type': 'kb query',
                                                                       'button': 'Validate Purchase',
                                                                       'text': 'Confirm the purchase is real with '
                                                                               '[Validate Purchase]. You need all '
                                                                               'three of:',
                                                                       'subtext': ['Username - if the customer does '
                                                                                   'not remember it, run the Recover '
                                                                                   'Username subflow first',
                                                                                   'Email address',
                                                                                   'Order ID - a 10-digit number '
                                                                                   'found in the confirmation email '
                                                                                   'or on the receipt']},
                                                                      {'type': 'kb query',
                                                                       'button': 'Ask the Oracle',
                                                                       'text': 'Use [Ask the Oracle] to find out why '
                                                                               'the code failed.',
                                                                       'subtext': ['Promo codes expire after 7 days',
                                                                                   'Promo codes cannot be applied to '
                                                                                   'orders that have already shipped',
                                                                                   'Only one promo code can be used '
                                                                                   'per order']},
                                                                      {'type': 'interaction',
                                                                       'button': 'Promo Code',
                                                                       'text': 'If a valid, unexpired code failed '
                                                                               'because of a system error, issue a '
                                                                               'replacement with [Promo Code].',
                                                                       'subtext': []}],
                                                          'instructions': ['Help customers whose promo code did not '
                                                                           'work.',
                                                                           'Policy: promo codes expire after 7 days '
                                                                           'and cannot be applied to orders that '
                                                                           'have already shipped.',
                                                                           'If the order has already shipped, the '
                                                                           'code cannot be added to it '
                                                                           'afterwards.']}}},
 'Shipping Issue': {'description': 'tracking, missing items and shipping charges',
                    'subflows': {'Missing Item': {'actions': [{'type': 'interaction',
                                                               'button': 'Pull up Account',
                                                               'text': "Start by asking for the customer's full name "
                                                                       '(first and last) and enter it with [Pull up '
                                                                       'Account]. This loads their account in the '
                                                                       'background.',
                                                               'subtext': []},
                                                              {'type': 'kb query',
                                                               'button': 'Validate Purchase',
                                                               'text': 'Confirm the purchase is real with [Validate '
                                                                       'Purchase]. You need all three of:',
                                                               'subtext': ['Username - if the customer does not '
                                                                           'remember it, run the Recover Username '
                                                                           'subflow first',
                                                                           'Email address',
                                                                           'Order ID - a 10-digit number found in '
                                                                           'the confirmation email or on the '
                                                                           'receipt']},
                                                              {'type': 'interaction',
                                                               'button': 'Record Reason',
                                                               'text': 'Record which item is missing with [Record '
                                                                       'Reason].',
                                                               'subtext': []},
                                                              {'type': 'interaction',
                                                               'button': 'Make Purchase',
                                                               'text': 'Send a free replacement with [Make '
                                                                       'Purchase].',
                                                               'subtext': ['Missing items are only reshipped if the '
                                                                           'order status is delivered and the claim '
                                                                           'is made within 30 days of delivery',
                                                                           'Each order can receive at most one free '
                                                                           'replacement']}],
                                                  'instructions': ['Replace items that did not arrive in a delivered '
                                                                   'package.',
                                                                   'Policy: claims later than 30 days after delivery '
                                                                   'go to the manager via [Notify Team].']}}},
 'Subscription Inquiry': {'description': 'billing for the premium subscription service',
                          'subflows': {'Manage Pay Bill': {'actions': [{'type': 'interaction',
                                                                        'button': 'Pull up Account',
                                                                        'text': "Start by asking for the customer's "
                                                                                'full name (first and last) and '
                                                                                'enter it with [Pull up Account]. '
                                                                                'This loads their account in the '
                                                                                'background.',
                                                                        'subtext': []},
                                                                       {'type': 'kb query',
                                                                        'button': 'Verify Identity',
                                                                        'text': "Verify the customer's identity with "
                                                                                '[Verify Identity] using their full '
                                                                                'name plus two of the following:',
                                                                        'subtext': ['Zip code',
                                                                                    'Phone number on file',
                                                                                    'Email address on file',
                                                                                    'Never reveal account '
                                                                                    'information before verification '
                                                                                    'succeeds']},
                                                                       {'type': 'kb query',
                                                                        'button': 'Subscription Status',
                                                                        'text': 'Check the amount due with '
                                                                                '[Subscription Status].',
                                                                        'subtext': []},
                                                                       {'type': 'interaction',
                                                                        'button': 'Enter Details',
                                                                        'text': 'Enter the last four digits of the '
                                                                                'card being used with [Enter '
                                                                                'Details].',
                                                                        'subtext': ['Subscription bills can be paid '
                                                                                    'with a credit or debit card; '
                                                                                    'gift cards cannot be used for '
                                                                                    'subscription bills']},
                                                                       {'type': 'interaction',
                                                                        'button': 'Update Account',
                                                                        'text': 'Record the payment with [Update '
                                                                                'Account] (pay bill).',
                                                                        'subtext': ['Subscription bills cannot be '
                                                                                    'extended more than 30 days past '
                                                                                    'the due date',
                                                                                    'A bill can be extended at most '
                                                                                    'once; customers cannot get an '
                                                                                    'extension beyond 30 days',
                                                                                    'Partial payments are not '
                                                                                    'accepted']}],
                                                           'instructions': ['Take payment for the premium '
                                                                            'subscription.',
                                                                            'Policy: bills cannot be extended more '
                                                                            'than 30 days.']}}}}
